"""torch.profiler helpers at the device level: a quiet start/stop, and the peak of torch's
own allocations on any device, read from the profiler's memory events.

torch 2.13 prints ``USDT:... profiler_start`` / ``profiler_stop`` from C++ to file
descriptor 2 each time a profiler starts or stops, and warns about every freed block it
saw no allocation for; in JupyterLab those are red lines under every profiled cell.  Only
those lines are dropped: anything else written to file descriptor 2 meanwhile is passed
on (after the scope: C-level stderr output of the code inside comes out at its end).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

from ..interrupts import HeldScope, deliver_pending, uninterruptible

# kineto's start/stop banner, and the warning that a block allocated before profiling was freed
# (harmless: the profiler just cannot pair that free with an allocation)
_BANNER = re.compile(r"^USDT:.*\] profiler_(start|stop)\s*$"
                     # in a process group's rank torch puts "[rank0]:" before its C++ warnings
                     r"|^(?:\[rank\d+\]:)?\[W.*\] Memory block of unknown size was allocated before the profiling started")


def is_profiler_banner(line: str) -> bool:
    """A line of kineto's own chatter (also in the output of a profiled rank)."""
    return _BANNER.match(line) is not None


class without_profiler_banner(HeldScope):
    """Send fd 2 to a temporary file for the scope, then pass on all but the banner lines.  A Ctrl-C
    can never leave fd 2 pointing at a deleted file (HeldScope)."""

    __slots__ = ("_saved", "_captured")

    def acquire(self) -> None:
        self._saved = self._captured = None
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no real fd 2 (embedded interpreters)
            return
        try:
            captured = tempfile.TemporaryFile()
        except OSError:  # no writable temporary directory: keep the banner rather than fail
            os.close(saved)
            return
        os.dup2(captured.fileno(), 2)
        self._saved, self._captured = saved, captured

    def release(self) -> None:
        saved, captured = self._saved, self._captured
        if saved is None:
            return
        self._saved = self._captured = None
        os.dup2(saved, 2)
        os.close(saved)
        with captured:
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
        kept = "".join(line for line in lines if not _BANNER.match(line))
        if kept:
            sys.stderr.write(kept)
            sys.stderr.flush()


@uninterruptible
def stop_profiler(prof) -> None:
    """Stop ``prof`` if it is running: checked, not assumed, since an interrupt may have landed
    before its start() finished."""
    if torch.autograd._profiler_enabled():
        prof.stop()
    deliver_pending()


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
    # the most the process took from the device above the start, torch's allocations and all else:
    # resident memory on CPU, the caching allocator's reserved memory on CUDA; None where unknown
    footprint_bytes: int | None = None


class ProfiledScope(HeldScope):
    """A CPU profiler running quietly for the scope, whose events ``read`` once it stops; what the scope
    yields is ``reading()``'s.  A Ctrl-C in the scope always finds the profiler stopped and fd 2 back
    (HeldScope), and the events are freed as soon as they are read."""

    __slots__ = ("_reading", "_quiet", "_prof")
    profile_memory = False

    def reading(self) -> Any:
        raise NotImplementedError

    def read(self, events, reading) -> None:
        raise NotImplementedError

    def acquire(self) -> Any:
        ensure_profiler_free()
        self._reading = self.reading()
        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                            profile_memory=self.profile_memory)
        self._quiet = without_profiler_banner()  # the whole scope: the free-before-start warning comes mid-run
        self._quiet.__enter__()
        try:
            self._prof.start()
        except BaseException:
            stop_profiler(self._prof)
            self._quiet.__exit__(None, None, None)
            raise
        return self._reading

    def release(self) -> None:
        prof = self._prof
        try:
            stop_profiler(prof)
        finally:
            self._quiet.__exit__(None, None, None)
        self.read(prof.profiler.kineto_results.events(), self._reading)
        prof.profiler.kineto_results = None  # free the events now (see engines/profile.py)


class allocation_peak(ProfiledScope):
    """Measure the scope's allocations on ``device_type`` (device ``index`` of it, when given:
    peaks are per device, never summed across GPUs) from the profiler's memory events.

    Unlike the CUDA allocator's peak counters this resets nothing the user may be watching,
    and it works on CPU, where torch keeps no allocator statistics at all.
    """

    __slots__ = ("_device_type", "_index")
    profile_memory = True

    def __init__(self, device_type: torch.autograd.DeviceType, index: int | None = None):
        self._device_type, self._index = device_type, index

    def reading(self) -> PeakReading:
        return PeakReading()

    def read(self, events, reading: PeakReading) -> None:
        level = 0
        for event in events:
            if (event.name() == "[memory]" and event.device_type() == self._device_type
                    and (self._index is None or event.device_index() == self._index)):
                level += event.nbytes()
                reading.peak_bytes = max(reading.peak_bytes, level)
        reading.net_bytes = level
