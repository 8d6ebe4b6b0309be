"""The result of ``%gpumem`` / ``torchmagic.memory``: devices, host, and the variables holding memory."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.render.base import Result


@dataclass
class DeviceMemory:
    label: str                                  # cuda:0
    name: str
    total_bytes: int | None = None              # NVML (or the device's own report)
    used_bytes: int | None = None               # NVML: all processes, and the driver's reserve
    driver_reserved_bytes: int | None = None    # NVML (v2 drivers): of used_bytes, what the driver sets aside
    allocated_bytes: int | None = None          # torch's tensors
    reserved_bytes: int | None = None           # torch's caching allocator (allocated + cached)
    peak_bytes: int | None = None               # peak allocated since the last reset
    peak_reserved_bytes: int | None = None
    inactive_split_bytes: int | None = None
    num_ooms: int | None = None
    num_alloc_retries: int | None = None
    utilization_pct: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    this_process_bytes: int | None = None       # NVML's figure for this process
    other_processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    variables_bytes: int = 0                    # held by notebook variables (storages counted once)
    notes: list[str] = field(default_factory=list)
    in_use: bool = True                         # this process holds a context there (has used the GPU)

    @property
    def cached_bytes(self) -> int | None:
        """Reserved but not allocated: torch keeps it for reuse; other processes cannot have it."""
        if self.reserved_bytes is None or self.allocated_bytes is None:
            return None
        return self.reserved_bytes - self.allocated_bytes

    @property
    def free_bytes(self) -> int | None:
        """NVML: what no process uses."""
        if self.used_bytes is None or self.total_bytes is None:
            return None
        return self.total_bytes - self.used_bytes

    @property
    def gap_bytes(self) -> int | None:
        """NVML's used less torch's reserved: the CUDA context, libraries, other processes."""
        if self.used_bytes is None or self.reserved_bytes is None:
            return None
        return self.used_bytes - self.reserved_bytes


@dataclass
class VariableMemory:
    name: str
    device: str
    bytes: int
    tensors: int
    type: str
    shared_bytes: int = 0   # of these bytes, also held by another variable (views, tied weights)
    partial: bool = False   # the walk stopped at a limit: there may be more
    graphs: int = 0         # of its tensors, those with an autograd graph behind them (not counted in bytes)


@dataclass
class CellMemory:
    """What one cell did to memory (``%%gpumem``)."""

    device: str
    peak_bytes: int | None          # the most the cell had allocated at once, above its start
    net_bytes: int                  # still allocated after it, above its start
    seconds: float
    new_variables: list[VariableMemory] = field(default_factory=list)  # what holds the net memory
    note: str | None = None


@dataclass
class Freed:
    """What ``--free`` removed and what came back."""

    names: list[str]
    dropped: list[str]                               # IPython references dropped (Out[3], _, the last traceback)
    reclaimed: dict[str, int] = field(default_factory=dict)   # device -> bytes no longer allocated
    still_alive_tensors: int = 0                     # tensors of the freed names something else still holds
    still_alive_bytes: int = 0


@dataclass
class MemoryResult(Result):
    devices: list[DeviceMemory]
    host: dict[str, Any]
    variables: list[VariableMemory]
    pinned: dict[str, dict[str, int]] = field(default_factory=dict)  # what -> device -> bytes no variable holds
    pinned_graphs: dict[str, int] = field(default_factory=dict)  # what -> tensors there with an autograd graph
    cell: CellMemory | None = None
    freed: Freed | None = None
    notes: list[str] = field(default_factory=list)
    top: int = 10

    def _view(self):
        from . import view  # imported when first shown (it imports this module for type checking only)

        return view

    def interrupted_line(self) -> str:
        return "interrupted: the cell's memory up to the interrupt is below"

    def to_dict(self) -> dict:
        data = asdict(self)
        for entry, device in zip(data["devices"], self.devices):
            entry.update(cached_bytes=device.cached_bytes, gap_bytes=device.gap_bytes, free_bytes=device.free_bytes)
        return data

    # -- views: rendered by view.py ---------------------------------------------------
    def device_lines(self) -> list[str]:
        return self._view().device_lines(self)

    def pinned_lines(self) -> list[str]:
        return self._view().pinned_lines(self)

    def __repr__(self) -> str:
        return f"<MemoryResult: {len(self.devices)} GPUs, {len(self.variables)} variables holding memory>"

