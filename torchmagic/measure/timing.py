"""Wall-clock timing that waits for the device, so queued GPU work is not missed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..devices import Device


def timed_call(fn: Callable[[], Any], device: Device) -> tuple[Any, float]:
    """Run ``fn`` once; return its value and the seconds it took, device work included."""
    __tracebackhide__ = True  # noqa: F841
    device.synchronize()
    start = time.perf_counter()
    value = fn()
    device.synchronize()
    return value, time.perf_counter() - start
