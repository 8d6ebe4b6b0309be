"""The result of ``%gpumem`` / ``torchmagic.memory``: devices, host, and the variables holding memory."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.render.base import Result, report_html
from ...core.render.format import fmt_bytes, fmt_s
from ...core.render.table import Column, Table


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

    def interrupted_line(self) -> str:
        return "interrupted: the cell's memory up to the interrupt is below"

    def to_dict(self) -> dict:
        data = asdict(self)
        for entry, device in zip(data["devices"], self.devices):
            entry.update(cached_bytes=device.cached_bytes, gap_bytes=device.gap_bytes, free_bytes=device.free_bytes)
        return data

    # --- text ---------------------------------------------------------------------------

    def headline(self) -> str:
        if self.cell is not None:
            c = self.cell
            peak = fmt_bytes(c.peak_bytes) if c.peak_bytes is not None else "not measured"
            return f"%%gpumem: the cell peaked at {peak} and kept {fmt_bytes(c.net_bytes)} on {c.device}"
        if self.freed is not None:
            got = ", ".join(f"{fmt_bytes(n)} on {d}" for d, n in self.freed.reclaimed.items()) or "nothing measurable"
            return f"{' '.join(['%gpumem --free', *self.freed.names])}: reclaimed {got}"
        if not self.devices:
            return "%gpumem: no GPU found; host memory and CPU tensors below"
        if len(self.devices) == 1:
            return f"%gpumem: {_device_line(self.devices[0])}"
        return "%gpumem: " + "; ".join(f"{d.label} {_device_line(d)}" for d in self.devices)

    def device_lines(self) -> list[str]:
        lines = []
        for d in self.devices:
            lines.append(f"{d.label} {d.name}: {_device_line(d)}")
            lines += [f"  {line}" for line in _device_details(d)]
        host = self.host
        rss = fmt_bytes(host.get("rss_bytes")) if host.get("rss_bytes") is not None else "unknown"
        lines.append(f"host: this process {rss} resident; {fmt_bytes(host.get('available_bytes'))} of "
                     f"{fmt_bytes(host.get('total_bytes'))} available; CPU tensors held by variables "
                     f"{fmt_bytes(host.get('variables_bytes', 0))}")
        return lines

    def pinned_lines(self) -> list[str]:
        what = {"history": "IPython's output history (Out, _, __, _N)",
                "traceback": "the last error's traceback (kept for %debug and %tb)"}
        lines = []
        for key, per_device in self.pinned.items():
            total = ", ".join(f"{fmt_bytes(n)} on {d}" for d, n in per_device.items() if n)
            graphs = self.pinned_graphs.get(key, 0)
            if not total:
                continue
            graph = (f", plus the autograd graph{'s' if graphs > 1 else ''} of {graphs} tensor{'s' if graphs > 1 else ''} "
                     "(not counted, often far more)") if graphs else ""
            lines.append(f"{what.get(key, key)} holds {total} that no variable holds{graph}: %gpumem --free drops it")
        return lines

    def _variables_table(self) -> Table:
        return Table([
            Column("variable", lambda v: v.name, "left"),
            Column("device", lambda v: v.device, "left"),
            Column("memory", lambda v: fmt_bytes(v.bytes)),
            Column("tensors", lambda v: f"{v.tensors:,}"),
            Column("type", lambda v: v.type + (" + autograd graph" if v.graphs else ""), "left"),
            Column("shared", lambda v: (fmt_bytes(v.shared_bytes) if v.shared_bytes else "")
                   + (" (walk stopped at a limit)" if v.partial else ""), "left"),
        ], self.variables, limit=self.top, noun="variables", hint=" (-o r: r.variables has them all)")

    def _cell_lines(self) -> list[str]:
        if self.cell is None:
            return []
        c = self.cell
        lines = [f"ran in {fmt_s(c.seconds)}; peak and net are torch's allocations on {c.device}, above the "
                 "cell's start (read from the profiler's memory events: no peak counter was reset)"]
        if c.note:
            lines.append(c.note)
        if c.new_variables:
            lines.append("held by: " + ", ".join(f"{v.name} {fmt_bytes(v.bytes)}" for v in c.new_variables[:8]))
        unheld = c.net_bytes - sum(v.bytes for v in c.new_variables)
        if unheld > max(0.05 * c.net_bytes, 2**20):
            with_graph = [v.name for v in c.new_variables if v.graphs]
            lines.append(f"{fmt_bytes(unheld)} of the net is held by no variable directly: usually the autograd "
                         "graph of an output computed with gradients on (the activations a backward would need"
                         + (f"; here {', '.join(with_graph)} {'has' if len(with_graph) == 1 else 'have'} one"
                            if with_graph else "")
                         + "), or objects the walk does not enter")
        return lines

    def _freed_lines(self) -> list[str]:
        if self.freed is None:
            return []
        f = self.freed
        lines = [f"deleted: {', '.join(f.names)}"] if f.names else []
        if f.dropped:
            lines.append(f"{'also dropped' if f.names else 'dropped'}: {', '.join(f.dropped)}")
        elif not f.names:
            lines.append("dropped nothing: no memory was held by IPython alone")
        if f.still_alive_tensors:
            lines.append(f"{f.still_alive_tensors} of their tensors ({fmt_bytes(f.still_alive_bytes)}) are still "
                         "held elsewhere: another variable, a closure, an object's attribute or a running frame")
        return lines

    def to_text(self) -> str:
        lines = [self.headline(), *self._cell_lines(), *self._freed_lines(), *self.device_lines(),
                 *self.pinned_lines(), *self.notes]
        if self.variables:
            lines += ["", "Largest variables by tensor memory (storages counted once):", self._variables_table().to_text()]
        return "\n".join(lines)

    def _body_html(self) -> str:
        notes = [*self._cell_lines(), *self._freed_lines(), *self.device_lines(), *self.pinned_lines(), *self.notes]
        out = f'<div class="tm-headline">{html.escape(self.headline())}</div>'
        out += "".join(f'<div class="tm-note">{html.escape(line)}</div>' for line in notes)
        if self.variables:
            out += ("<h4>Largest variables by tensor memory (storages counted once)</h4>"
                    + self._variables_table().to_html())
        return out

    def to_html(self) -> str:
        return report_html(self._body_html())

    def __repr__(self) -> str:
        return f"<MemoryResult: {len(self.devices)} GPUs, {len(self.variables)} variables holding memory>"


def _device_line(d: DeviceMemory) -> str:
    parts = []
    if d.used_bytes is not None and d.total_bytes:
        parts.append(f"{fmt_bytes(d.used_bytes)} of {fmt_bytes(d.total_bytes)} used (all processes)")
    if not d.in_use:
        parts.append("not used by this process")
    elif d.allocated_bytes is not None:
        parts.append(f"torch {fmt_bytes(d.allocated_bytes)} allocated, {fmt_bytes(d.reserved_bytes)} reserved")
    if d.utilization_pct is not None:
        parts.append(f"{d.utilization_pct:.0f}% busy")
    return ", ".join(parts) or "no readings"


def _device_details(d: DeviceMemory) -> list[str]:
    lines = []
    if d.peak_bytes is not None and d.in_use:
        lines.append(f"peak allocated {fmt_bytes(d.peak_bytes)} (reserved {fmt_bytes(d.peak_reserved_bytes)}) "
                     "since the last reset (%gpumem --reset)")
    if d.cached_bytes:
        split = (f", {fmt_bytes(d.inactive_split_bytes)} of it in split blocks (fragmentation)"
                 if d.inactive_split_bytes else "")
        lines.append(f"cached by torch (reserved − allocated, often called fragmentation): {fmt_bytes(d.cached_bytes)}"
                     f"{split}; torch reuses it, other processes cannot (torch.cuda.empty_cache() hands it back)")
    if d.num_ooms or d.num_alloc_retries:
        lines.append(f"{d.num_ooms} out-of-memory errors and {d.num_alloc_retries} allocator retries "
                     "(cache flushed to satisfy an allocation) so far")
    env = []
    if d.temperature_c is not None:
        env.append(f"{d.temperature_c:.0f} °C")
    if d.power_w is not None:
        env.append(f"{d.power_w:.0f} W")
    if env:
        lines.append(" · ".join(env))
    if d.allocated_bytes:
        lines.append(f"held by notebook variables: {fmt_bytes(d.variables_bytes)} of the "
                     f"{fmt_bytes(d.allocated_bytes)} allocated")
    return lines + d.notes
