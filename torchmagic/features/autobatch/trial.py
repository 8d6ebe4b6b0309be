"""One trial of the user's step at a batch size, and its throughput: what every ``%autobatch`` engine
runs, in the notebook's process or on each rank of a data-parallel job."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from ...core.devices import Device, is_out_of_memory
from ...core.limits import describe_error
from ...core.measure import timed_call
from ...core.state import Snapshot
from .footprint import FootprintCount, agree, read_footprints
from .result import TRIAL_STEPS, ThroughputPoint
from .search import Probe, SearchSpace

THROUGHPUT_REPEATS = 3


def run_trial(step: Callable[[int], Any], size: int, device: Device,
              reset: Callable[..., None] | None = None, footprint: FootprintCount | None = None) -> Probe:
    """``TRIAL_STEPS`` steps at ``size`` and their peak above the start.  ``reset(collect)`` puts the
    state back after each run (default: only memory is released).  ``footprint``: how many runs read
    the footprint and what it counts, with the reads of the search's trials so far."""
    __tracebackhide__ = True  # noqa: F841
    reset = reset or (lambda collect=True: release(device, collect))
    error = unallocated = None
    start = time.perf_counter()
    with device.peak_scope() as reading:
        try:
            for _ in range(TRIAL_STEPS):
                step(size)
            device.synchronize()
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            error = describe_error(exc, width=200)
            unallocated = _unallocated(device)
    seconds = (time.perf_counter() - start) / TRIAL_STEPS
    # Out here, past the except block, the failed step's frames and the tensors they hold are
    # unreachable; a collection frees what sits in reference cycles.  A step that succeeded
    # freed its tensors by reference counting (a full collection costs ~0.15 s with torch loaded).
    reset(collect=error is not None)
    if error is not None:
        return Probe(size, None, False, seconds=seconds, error=error, unallocated_bytes=unallocated)
    # what counts against the budget: torch's allocations, or all the process took if that is more
    # (CPU: resident memory, for Python objects, oneDNN scratch and malloc's pages; CUDA: reserved)
    footprint = footprint or FootprintCount()
    reads = read_footprints(step, size, device, reset, footprint.runs_for(reading.peak_bytes))
    counted = footprint.counted(reads, reading.peak_bytes) if reads else reading.footprint_bytes
    peak = max(reading.peak_bytes, counted or 0)
    shown = reads and (not agree(reads) or counted > max(reads))  # the reads behind a peak they do not show
    return Probe(size, peak, True, seconds=seconds, allocated_bytes=reading.peak_bytes,
                 footprint_reads=reads if shown else None)


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
