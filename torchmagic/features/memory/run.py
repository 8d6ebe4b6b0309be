"""What a cell did to memory (``%%gpumem``, ``torchmagic.measure_memory``): its peak and net
allocations on the device, and the new variables that hold the net."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from ...core.devices import Device, choose_device
from ...core.devices.profiler import ProfilerBusyError
from ...core.interrupts import guards
from ...core.outcome import Outcome
from .report import holdings, memory_report, user_variables, variable_rows
from .result import CellMemory, MemoryResult


@guards
def run_cell_memory(fn: Callable[[], Any], namespace: dict[str, Any], *, hidden: Iterable[str] = (),
                    device: Device | None = None, top: int = 10) -> Outcome[MemoryResult]:
    """Run ``fn`` and measure its peak and net allocations on the device, then name the new
    variables that hold the net memory."""
    __tracebackhide__ = True  # noqa: F841
    device = device or choose_device()
    before = holdings(user_variables(namespace, hidden))
    value, error, reading, note, net = None, None, None, None, 0
    start = time.perf_counter()
    try:
        with device.peak_scope() as reading:
            try:
                value = fn()
            except BaseException as exc:  # noqa: BLE001  the user's error: re-raised after the figures
                error = exc
            device.synchronize()
    except ProfilerBusyError:  # raised before the cell ran: run it without the peak
        note = "peak not measured: a torch.profiler session is running (torch cannot nest them); net only"
        allocated = device.memory_in_use()
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001
            error = exc
        after = device.memory_in_use()
        net = after - allocated if after is not None and allocated is not None else 0
    peak = reading.peak_bytes if reading is not None else None
    net = reading.net_bytes if reading is not None else net
    seconds = time.perf_counter() - start
    variables = user_variables(namespace, hidden)
    after = holdings(variables)
    new = set(after.union) - set(before.union)
    rows = [r for r in variable_rows(after, variables, only=new) if r.device == device.label]
    report = memory_report(namespace, hidden=hidden, devices=[d for d in [device] if d.is_accelerator], top=top)
    report.cell = CellMemory(device=device.label, peak_bytes=peak, net_bytes=net, seconds=seconds,
                             new_variables=rows, note=note)
    report.notes += [n for n in (device.choice_note(),) if n]
    return Outcome(report, value, error)
