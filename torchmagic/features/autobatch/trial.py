"""One trial of the user's step at a batch size, and its throughput: what every ``%autobatch`` engine
runs, in the notebook's process or on each rank of a data-parallel job."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...core.devices import Device, is_out_of_memory
from ...core.devices.profiler import PeakReading
from ...core.limits import describe_error
from ...core.measure import timed_call
from ...core.state import Snapshot
from .footprint import FootprintCount, agree, read_footprints
from .leak import LeakWatch
from .result import ThroughputPoint
from .search import TRIAL_STEPS, Probe, SearchSpace

THROUGHPUT_REPEATS = 3


def run_trial(step: Callable[[int], Any], size: int, device: Device, reset: Callable[..., None] | None = None,
              footprint: FootprintCount | None = None, leaks: LeakWatch | None = None) -> Probe:
    """``TRIAL_STEPS`` steps at ``size`` and their peak above the start.  ``reset(collect)`` puts the
    state back after each run (default: only memory is released).  ``footprint``: how many runs read
    the footprint and what it counts, with the reads of the search's trials so far.  ``leaks`` reads
    what each run left held (its ``leak`` says where that grew run after run)."""
    __tracebackhide__ = True  # noqa: F841
    reset = reset or (lambda collect=True: release(device, collect))
    if leaks is not None:
        reset = leaks.around_runs(size, reset)
    run = _Run(step, size, device, device.peak_scope())
    if leaks is not None:
        leaks.peaked(run.reading.peak_bytes)
    reset(collect=run.error is not None)
    if run.error is not None:
        return run.failed()
    # what counts against the budget: torch's allocations, or all the process took if that is more
    # (CPU: resident memory, for Python objects, oneDNN scratch and malloc's pages; CUDA: reserved)
    allocated = run.reading.peak_bytes
    footprint = footprint or FootprintCount()
    reads = read_footprints(step, size, device, reset, footprint.runs_for(allocated))
    counted = footprint.counted(reads, allocated) if reads else run.reading.footprint_bytes
    peak = max(allocated, counted or 0)
    shown = reads and (not agree(reads) or counted > max(reads))  # the reads behind a peak they do not show
    if leaks is not None:  # a GPU trial is one run: more where it left memory held, to tell a leak from a first use
        leaks.confirm(lambda: _ran_again(step, size, device, reset))
    return Probe(size, peak, True, seconds=run.seconds, allocated_bytes=allocated,
                 footprint_reads=reads if shown else None)


def run_first_trial(step: Callable[[int], Any], size: int, device: Device, reset: Callable[..., None]) -> Probe:
    """A trial in a process that ran no step before (``--fresh``): the footprint of its first
    ``TRIAL_STEPS`` steps, from a heap as new as a script's (CPU: glibc's mmap threshold not yet risen,
    no freed pages kept), its one read; then torch's allocations, in a run of their own (the profiler's
    event buffers would count in the first).  Where the device has no footprint to read apart (CUDA),
    a plain trial's first run is the fresh one."""
    __tracebackhide__ = True  # noqa: F841
    scope = device.footprint_scope()
    if scope is None:
        return run_trial(step, size, device, reset)
    first = _Run(step, size, device, scope)
    reset(collect=first.error is not None)
    if first.error is not None:
        return first.failed()
    probe = run_trial(step, size, device, reset, FootprintCount(runs=(0, 0)))  # allocations only: read already
    read = first.reading.footprint_bytes
    if not probe.ran or read is None:
        return probe
    return replace(probe, peak_bytes=max(probe.peak_bytes, read), seconds=first.seconds, footprint_reads=(read,))


class _Run:
    """``TRIAL_STEPS`` steps at a size within ``scope`` (a peak reading): their reading and time per
    step, or the out-of-memory error that ended them (any other error is the step's own: raised)."""

    def __init__(self, step: Callable[[int], Any], size: int, device: Device, scope):
        __tracebackhide__ = True  # noqa: F841
        self.size, self.error, self.unallocated = size, None, None
        start = time.perf_counter()
        with scope as self.reading:
            try:
                for _ in range(TRIAL_STEPS):
                    step(size)
                device.synchronize()
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                self.error = describe_error(exc, width=200)
                self.unallocated = _unallocated(device)
        self.seconds = (time.perf_counter() - start) / TRIAL_STEPS
        # Out here, past the except block, the failed step's frames and the tensors they hold are
        # unreachable; the caller's reset collects what sits in reference cycles.  A step that
        # succeeded freed its tensors by reference counting (a full collection costs ~0.15 s).

    def failed(self) -> Probe:
        return Probe(self.size, None, False, seconds=self.seconds, error=self.error,
                     unallocated_bytes=self.unallocated)


def _ran_again(step: Callable[[int], Any], size: int, device: Device, reset: Callable[..., None]) -> bool:
    """One more run of ``TRIAL_STEPS`` steps at ``size``, read for nothing but what it leaves held
    (``reset`` reads that); False where it ran out of memory."""
    __tracebackhide__ = True  # noqa: F841
    run = _Run(step, size, device, contextlib.nullcontext(PeakReading()))
    reset(collect=run.error is not None)
    return run.error is None


def measure_throughput(step: Callable[[int], Any], answer: int, space: SearchSpace, device: Device
                       ) -> list[ThroughputPoint]:
    """Samples/s at the answer and at halvings of it, un-profiled: the median of a few timed
    steps after one untimed one.  Only sizes at or below the verified answer are run."""
    sizes = []
    size = answer
    while size >= space.smallest and len(sizes) < 6:
        sizes.append(size)
        size = space.round_down(size / 2)
    points = []
    for size in sorted(set(sizes)):
        step(size)
        times = [timed_call(lambda: step(size), device)[1] for _ in range(THROUGHPUT_REPEATS)]
        median = statistics.median(times)
        points.append(ThroughputPoint(size, size / median, median))
    release(device)
    return points


def starting_over(snapshot: Snapshot, device: Device) -> Callable[..., None]:
    """``reset(collect=True)``: back to where the user's training starts, after each trial's runs:
    their weights and optimizer state (often none yet: a trial's first step then creates it, as the
    first training step will), and memory released."""
    def reset(collect: bool = True) -> None:
        snapshot.restore()
        release(device, collect)
    return reset


def release(device: Device, collect: bool = True) -> None:
    if collect:
        gc.collect()
    device.empty_cache()  # each trial starts from an empty cache: no fragmentation carried over


def _unallocated(device: Device) -> int | None:
    """What the caching allocator held but could not use when the step ran out: the number
    PyTorch's own OOM message reports as "reserved but unallocated"."""
    reserved, allocated = device.memory_reserved(), device.memory_allocated()
    return None if reserved is None or allocated is None else max(reserved - allocated, 0)
