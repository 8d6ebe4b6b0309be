"""torch.profiler helpers at the device level: a quiet start/stop, and the peak of torch's
own allocations on any device, read from the profiler's memory events.

torch 2.13 prints ``USDT:... profiler_start`` / ``profiler_stop`` from C++ to file
descriptor 2 each time a profiler starts or stops, and warns about every freed block it
saw no allocation for; in JupyterLab those are red lines under every profiled cell.  Only
those lines are dropped: anything else written to file descriptor 2 meanwhile is passed
on (after the scope: C-level stderr output of the code inside comes out at its end).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import torch

# kineto's start/stop banner, and the warning that a block allocated before profiling was freed
# (harmless: the profiler just cannot pair that free with an allocation)
_BANNER = re.compile(r"^USDT:.*\] profiler_(start|stop)\s*$"
                     r"|^\[W.*\] Memory block of unknown size was allocated before the profiling started")


@contextlib.contextmanager
def without_profiler_banner() -> Iterator[None]:
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real fd 2 (embedded interpreters)
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not _BANNER.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


class ProfilerBusyError(RuntimeError):
    """Another torch.profiler session is running; torch cannot nest them."""


def ensure_profiler_free() -> None:
    """Starting a profiler inside another one stops the outer one's session: refuse instead."""
    if torch.autograd._profiler_enabled():
        raise ProfilerBusyError("a torch.profiler session is already running (an enclosing "
                                "`with torch.profiler.profile()`?); stop it first")


@dataclass
class PeakReading:
    """Bytes torch allocated on one device within a scope, relative to its start."""

    peak_bytes: int = 0   # the most in use at once above the start
    net_bytes: int = 0    # still in use at the end, above the start


@contextlib.contextmanager
def allocation_peak(device_type: torch.autograd.DeviceType, index: int | None = None) -> Iterator[PeakReading]:
    """Measure the scope's allocations on ``device_type`` (device ``index`` of it, when given:
    peaks are per device, never summed across GPUs) from the profiler's memory events.

    Unlike the CUDA allocator's peak counters this resets nothing the user may be watching,
    and it works on CPU, where torch keeps no allocator statistics at all.
    """
    ensure_profiler_free()
    reading = PeakReading()
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
    with without_profiler_banner():  # the whole scope: the free-before-start warning comes mid-run
        prof.start()
        try:
            yield reading
        finally:
            prof.stop()
        level = 0
        for event in prof.profiler.kineto_results.events():
            if (event.name() == "[memory]" and event.device_type() == device_type
                    and (index is None or event.device_index() == index)):
                level += event.nbytes()
                reading.peak_bytes = max(reading.peak_bytes, level)
        reading.net_bytes = level
        prof.profiler.kineto_results = None  # free the events now (see engines/profile.py)
