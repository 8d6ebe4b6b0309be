"""Where memory went (``%gpumem``): devices (NVML and torch's allocator), the host, and the notebook's
variables.  Nothing here imports IPython: the namespace is a dict."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...core.devices import Device, NvmlReading, host_memory, visible_accelerators
from ...core.gc_pause import gc_paused
from ...core.shell import is_internal
from .holders import Holding, Walker
from .pins import Pin, ipython_names, namespace_pins
from .result import DeviceMemory, MemoryResult, VariableMemory

@dataclass
class Holdings:
    """Every user variable's holding, and which storages more than one of them reach."""

    by_name: dict[str, Holding]
    counts: dict[tuple[str, int], int]

    @property
    def union(self) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for holding in self.by_name.values():
            out.update(holding.storages)
        return out


def user_variables(namespace: dict[str, Any], hidden: Iterable[str] = ()) -> dict[str, Any]:
    """The user's own names: not IPython's (its history and set-up names, see ``ipython_names``),
    and none starting with two underscores (dunders, and the helper globals torch.compile puts in a
    notebook's namespace) but the user's own ``__`` and ``___``."""
    ipython = ipython_names(namespace, hidden)
    return {name: value for name, value in namespace.items()
            if name not in ipython and (not is_internal(name) or not name.strip("_"))}


def holdings(variables: dict[str, Any], walker: Walker | None = None) -> Holdings:
    walker = walker or Walker()
    by_name = {}
    counts: dict[tuple[str, int], int] = {}
    for name, value in variables.items():
        holding = walker.holding(value)
        if holding.storages:
            by_name[name] = holding
            for key in holding.storages:
                counts[key] = counts.get(key, 0) + 1
    return Holdings(by_name, counts)


def variable_rows(found: Holdings, variables: dict[str, Any], only: set[tuple[str, int]] | None = None
                  ) -> list[VariableMemory]:
    """One row per variable and device, largest first; ``only`` limits to those storages."""
    rows = []
    for name, holding in found.by_name.items():
        per_device: dict[str, list[int]] = {}
        for key, nbytes in holding.storages.items():
            if only is not None and key not in only:
                continue
            totals = per_device.setdefault(key[0], [0, 0])
            totals[0] += nbytes
            if found.counts.get(key, 0) > 1:
                totals[1] += nbytes
        for device, (nbytes, shared) in per_device.items():
            rows.append(VariableMemory(name=name, device=device, bytes=nbytes,
                                       tensors=holding.tensors.get(device, 0), type=type(variables[name]).__name__,
                                       shared_bytes=shared, partial=holding.partial, graphs=len(holding.graphs)))
    rows.sort(key=lambda r: (-r.bytes, r.name))
    return rows


def memory_report(namespace: dict[str, Any] | None = None, *, hidden: Iterable[str] = (),
                  devices: list[Device] | None = None, top: int = 10, pins: list[Pin] | None = None) -> MemoryResult:
    """The whole picture now: every GPU, the host, and the variables of ``namespace``.

    ``pins`` are the places besides variables that keep memory alive (default: what the
    namespace shows of IPython's history, and the last traceback).
    """
    with gc_paused():
        return _memory_report(namespace if namespace is not None else {}, hidden, devices, top, pins)


def _memory_report(namespace, hidden, devices, top, pins) -> MemoryResult:
    pins = namespace_pins(namespace, ipython_names(namespace, hidden)) if pins is None else pins
    devices = visible_accelerators() if devices is None else devices
    walker = Walker()
    variables = user_variables(namespace, hidden)
    found = holdings(variables, walker)
    union = found.union
    per_device_held = _bytes_by_device(union)
    readings = [_device_memory(d, per_device_held.get(d.label, 0)) for d in devices]
    host = host_memory()
    notes = [] if devices else ["no GPU found: torch.cuda.is_available() is False"]
    pinned, pinned_graphs = _pinned(pins, set(union), walker)
    if any(h.partial for h in found.by_name.values()):
        notes.append("some variables were only partly walked (a limit on depth or items was reached)")
    return MemoryResult(
        devices=readings,
        host={"rss_bytes": host.rss_bytes, "available_bytes": host.available_bytes, "total_bytes": host.total_bytes,
              "variables_bytes": per_device_held.get("cpu", 0)},
        variables=variable_rows(found, variables),
        pinned=pinned, pinned_graphs=pinned_graphs,
        notes=notes, top=top)


def _bytes_by_device(storages: dict[tuple[str, int], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (device, _), nbytes in storages.items():
        out[device] = out.get(device, 0) + nbytes
    return out


def _pinned(pins: list[Pin], held: set, walker: Walker) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Memory that only IPython's history or the last traceback keeps alive, by kind and device;
    and, by kind, the tensors there with an autograd graph that no variable holds."""
    storages: dict[str, dict[tuple[str, int], int]] = {}
    graphs: dict[str, set[int]] = {}
    for pin in pins:
        holding = walker.holding(pin.value)
        storages.setdefault(pin.kind, {}).update(holding.storages)
        if holding.graphs and not set(holding.storages) <= held:
            graphs.setdefault(pin.kind, set()).update(holding.graphs)
    out = {}
    for kind, found in storages.items():
        only_there = {k: n for k, n in found.items() if k not in held}
        if only_there:
            out[kind] = _bytes_by_device(only_there)
    return out, {kind: len(ids) for kind, ids in graphs.items()}


def _device_memory(device: Device, variables_bytes: int) -> DeviceMemory:
    d = DeviceMemory(label=device.label, name=device.name, variables_bytes=variables_bytes)
    stats = device.allocator_stats()
    if stats is not None:
        d.allocated_bytes, d.reserved_bytes = stats.allocated_bytes, stats.reserved_bytes
        d.peak_bytes, d.peak_reserved_bytes = stats.peak_allocated_bytes, stats.peak_reserved_bytes
        d.inactive_split_bytes = stats.inactive_split_bytes
        d.num_ooms, d.num_alloc_retries = stats.num_ooms, stats.num_alloc_retries
    else:
        d.allocated_bytes, d.reserved_bytes = device.memory_allocated(), device.memory_reserved()
    d.in_use = device.has_context() or bool(d.reserved_bytes)
    reading = device.nvml()
    if isinstance(reading, NvmlReading):
        d.total_bytes, d.used_bytes = reading.total_bytes, reading.used_bytes
        d.utilization_pct, d.temperature_c, d.power_w = reading.utilization_pct, reading.temperature_c, reading.power_w
        _explain_gap(d, reading)
    elif isinstance(reading, str):
        d.notes.append(reading)
    return d


def _explain_gap(d: DeviceMemory, reading: NvmlReading) -> None:
    """Why NVML shows more in use than torch reserved: the driver's reserve, this process's
    CUDA context and libraries, other processes; each counted once, none guessed."""
    from ...core.render.format import fmt_bytes

    d.driver_reserved_bytes = reading.driver_reserved_bytes
    if reading.mig:
        d.notes.append("a MIG slice: memory is the slice's own; NVML reports no utilisation per slice")
    gap = d.gap_bytes
    if gap is None:
        return
    # v2 memory info tells apart what the driver sets aside: neither this process's nor another's
    parts = [f"driver-reserved {fmt_bytes(reading.driver_reserved_bytes)}"] if reading.driver_reserved_bytes else []
    if reading.processes is None:
        parts.append(f"this process's CUDA context (typically 300–600 MiB), libraries' workspaces, and any other "
                     f"processes; {reading.processes_note}")
        d.notes.append(f"NVML used − torch reserved = {fmt_bytes(gap)}: " + "; ".join(parts))
        return
    reserved = d.reserved_bytes or 0
    mine, others, unsure = _this_process(reading.processes, reserved, d.in_use)
    d.other_processes = [(p.pid, p.used_bytes) for p in others]
    if mine is not None and mine.used_bytes:  # 0 or None: listed without its memory
        d.this_process_bytes = mine.used_bytes
        host_pid = f" (pid {mine.pid} on the host, where NVML counts)" if mine.pid != os.getpid() else ""
        parts.append(f"this process's CUDA context, libraries and memory outside torch's allocator "
                     f"{fmt_bytes(max(mine.used_bytes - reserved, 0))}{host_pid}")
    elif mine is not None:
        parts.append("NVML lists this process without its memory")
    elif unsure:
        listed = ", ".join(f"pid {p.pid} {fmt_bytes(p.used_bytes)}" for p in unsure[:4])
        which = f"whether {listed} is" if len(unsure) == 1 else f"which of {len(unsure)} processes ({listed}) is"
        parts.append(f"NVML lists host PIDs and cannot tell {which} this process: counted neither as this "
                     f"process nor as others")
    elif d.in_use:
        parts.append("NVML does not list this process, so its CUDA context is in the rest")
    if others:
        listed = ", ".join(f"pid {p.pid} {fmt_bytes(p.used_bytes)}" for p in others[:4])
        parts.append(f"{len(others)} other process{'es' if len(others) != 1 else ''} "
                     f"{fmt_bytes(sum(p.used_bytes or 0 for p in others))} ({listed})")
    if reading.processes_note:
        parts.append(reading.processes_note)
    d.notes.append(f"NVML used − torch reserved = {fmt_bytes(gap)}: " + "; ".join(parts))


def _this_process(processes, reserved: int, uses_cuda: bool):
    """(this process's entry or None, other processes, entries that may be this process) in NVML's list.

    NVML lists host PIDs, so in a container (another PID namespace) this process's PID is not
    there, or names a different host process.  It is then found by elimination: of the entries
    whose PIDs do not exist here, the only one using at least what torch has reserved here.
    Where no single entry qualifies, the candidates are kept apart rather than guessed.
    """
    me, contained = os.getpid(), _in_pid_namespace()
    listed = next((p for p in processes if p.pid == me), None)
    # in a container the same number can be a host process; this one holds at least torch's reserve
    # ... and one listed with nothing (0: a driver that does not count per process) is this one without its memory
    if listed and (not contained or not listed.used_bytes or listed.used_bytes >= reserved):
        return listed, [p for p in processes if p is not listed], []
    if not (uses_cuda and contained):  # no CUDA context here, or no namespace to see through
        return None, list(processes), []
    candidates = [p for p in processes if not _pid_exists_here(p.pid)
                  and (p.used_bytes is None or p.used_bytes >= reserved)]
    others = [p for p in processes if p not in candidates]
    if len(candidates) == 1 and reserved > 0:  # with nothing reserved, any process would fit
        return candidates[0], others, []
    return None, others, candidates


def _in_pid_namespace() -> bool | None:
    """Whether this process runs in a PID namespace other than the host's (a container); None
    where /proc cannot tell.  The kernel numbers the initial namespace 0xEFFFFFFC
    (PROC_PID_INIT_INO).  /proc/self/status's NSpid does not help: it starts at the namespace
    /proc was mounted from, the container's own, so it never shows the host's PID."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino != 0xEFFFFFFC
    except OSError:
        return None


def _pid_exists_here(pid: int) -> bool:
    """Whether a process with this number exists in this PID namespace (signal 0 sends nothing;
    only called on Linux, where it is safe)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True
