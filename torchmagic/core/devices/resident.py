"""The process's resident memory over a scope: all that a step takes from the machine's RAM.

torch's CPU allocations (the profiler's memory events) miss what a step allocates otherwise:
Python objects, oneDNN's scratch buffers, malloc's bookkeeping and the pages it keeps.  A budget
meant for a container's memory limit has to count those too.  The peak is read from the kernel's
high-water mark (VmHWM) where the scope set a new one, which is exact; else from a thread that
samples the resident size every millisecond, a lower bound (a spike shorter than that is missed).
The high-water mark is only read, never reset: it is the user's (getrusage's ru_maxrss).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time

from ..interrupts import HeldScope
from .profiler import PeakReading

SAMPLE_S = 0.001
LONG_S = 1.0
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """The process's resident memory now (Linux), or None."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.lru_cache(maxsize=1)
def _mallinfo2():
    try:
        function = ctypes.CDLL(None).mallinfo2  # glibc 2.33 onwards
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


def heap_in_use() -> int | None:
    """Bytes the process's malloc has handed out and not had back (glibc's mallinfo2: its heap's blocks in
    use and its mmapped ones), or None where there is no such count.  Unlike the resident size it grows
    when freed pages are used again: the events a second profile in one process holds show here, where
    the resident size stayed flat over a second 84 MiB capture (measured here, torch 2.13)."""
    function = _mallinfo2()
    if function is None:
        return None
    info = function()
    return info.uordblks + info.hblkhd


def resident_high_water() -> int | None:
    """The most resident memory the process ever had (VmHWM, Linux), or None."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class ResidentPeak:
    """``start()``, then ``stop()`` -> the most resident memory above the start, or None where
    the process's memory cannot be read (not Linux)."""

    __slots__ = ("_start", "_high_water", "_most", "_done", "_thread")

    def __init__(self):
        self._thread = None

    def start(self) -> None:
        self._start = self._most = resident_bytes()
        self._high_water = resident_high_water()
        if self._start is None:
            return
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="torchmagic-resident-memory", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        started = time.monotonic()
        # every millisecond at first; a long scope (a whole %%gpumem cell) every 10: its own cost
        # stays near 0.1% of a core, and VmHWM catches the peaks that matter there
        while not self._done.wait(SAMPLE_S if time.monotonic() - started < LONG_S else 10 * SAMPLE_S):
            now = resident_bytes()
            if now is not None and now > self._most:
                self._most = now

    def stop(self) -> int | None:
        """End the sampling (idempotent); the peak above the start."""
        thread, self._thread = self._thread, None
        if thread is None:
            return None
        self._done.set()
        thread.join()
        most = max(self._most, resident_bytes() or 0)
        high_water = resident_high_water()
        if high_water is not None and self._high_water is not None and high_water > self._high_water:
            most = max(most, high_water)  # the scope set a new high-water mark: that is its exact peak
        return max(most - self._start, 0)


class resident_peak(HeldScope):
    """The process's resident-memory peak over the scope, above its start, as a PeakReading's
    ``footprint_bytes``.  Read in a run of its own, without the profiler: the profiler's own event
    buffers are resident memory too (20 MiB for a checkpointed step that allocated 7)."""

    __slots__ = ("_sampler", "_reading")

    def acquire(self) -> PeakReading:
        self._reading = PeakReading()
        self._sampler = ResidentPeak()
        self._sampler.start()
        return self._reading

    def release(self) -> None:
        self._reading.footprint_bytes = self._sampler.stop()
