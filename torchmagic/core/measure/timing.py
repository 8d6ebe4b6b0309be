"""Wall-clock timing that waits for the device, so queued GPU work is not missed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from ..devices import Device

# The profiler shows our end-of-step wait under this name, apart from the user's own syncs.
DEVICE_WAIT_MARKER = "torchmagic::wait_for_device"


def timed_call(fn: Callable[[], Any], device: Device, marker: str | None = None) -> tuple[Any, float]:
    """Run ``fn`` once; return its value and the seconds it took, device work included.

    With ``marker``, the call and the wait for the device are recorded as one profiler range
    of that name (a ``ProfilerStep#N``), so the step's window covers the GPU work it queued.
    """
    __tracebackhide__ = True  # noqa: F841
    device.synchronize()
    start = time.perf_counter()
    with torch.profiler.record_function(marker) if marker else contextlib.nullcontext():
        value = fn()
        if marker and device.is_accelerator:
            with torch.profiler.record_function(DEVICE_WAIT_MARKER):
                device.synchronize()
        else:
            device.synchronize()
    return value, time.perf_counter() - start


def timed_block(fn: Callable[[], Any], calls: int, device: Device) -> float:
    """Seconds ``calls`` back-to-back calls of ``fn`` take, the device synchronised at both ends
    only (as torch.utils.benchmark times a block): queued work overlaps as it would in a loop."""
    __tracebackhide__ = True  # noqa: F841
    device.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    device.synchronize()
    return time.perf_counter() - start
