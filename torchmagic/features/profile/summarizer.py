"""summarize_trace's pipeline (trace.py's docstring) fed a trace in groups of consecutive steps, into one
TraceSummary: a trace too big to hold at once is summarised one group's events at a time.

Between groups only what later events need is carried: every step's window, the main thread, the memory
level per device, which op names and kernel names were seen (a first call and a first launch are one-time
costs), and the device's and the other threads' busy intervals of the group before (a kernel may run past
the next group's start, and so may another thread's work the main thread waits for).
What links one event to another (kernels to their launch, a child to its parent) stays within a group:
the caller puts a kernel in its launch's group, and groups start where steps do.  The lists that grow with
the events (kernel durations, Python ops) are compact arrays, 8 bytes an item, when asked."""

from __future__ import annotations

import math
from array import array
from collections import Counter, defaultdict

import torch

from ...core.gc_pause import gc_paused
from .categories import OTHER
from .column_intervals import as_set
from .device_attribution import Busy, attribute_device, count_lost_events
from .events import ANNOTATION, PYTHON, Ev, link_runtime_threads, read_events
from .intervals import IntervalSet
from .kineto import STEP_PREFIX, is_copy_to_host
from .summary import TraceSummary
from .sweep import MAIN_LANE, Sweep
from .timeline import bound_timeline


class TraceSummarizer:
    """One summary built from groups of events, each group a run of consecutive steps (in time order)."""

    def __init__(self, trace_start_ns: int, *, shapes: bool = False, flops: bool = False, compact: bool = False,
                 read=read_events):
        """``read``: events.read_events, or a function of the same result for one adapter's events."""
        self.out, self.read = TraceSummary(), read
        if compact:  # per kernel and per Python op: 8 bytes each rather than a float object and its pointer
            self.out.kernel_us, self.out.launch_delay_us = array("d"), array("d")
            self.out.python_op_us, self.out.python_gap_us = array("d"), array("d")
            self.out.python_op_nodes, self.out.python_op_sync = array("q"), array("b")
        self.trace_start_ns, self.shapes, self.flops = trace_start_ns, shapes, flops
        self.windows: list[tuple[float, float]] = []  # every step's (start, end) so far, µs since the start
        self.main_tid = None
        self.op_calls: Counter = Counter()     # op name -> calls so far (a first call may be a one-time cost)
        self.first_kernels: dict[str, int] = {}  # kernel name -> the correlation id of its first launch
        self.level: dict[str, int] = defaultdict(int)  # device -> bytes allocated so far
        self.base: dict[str, int] = {}          # device -> its level at the first step's start
        self.busy_before = Busy()  # the group before's device intervals
        self.others_after: list[tuple[float, float]] = []  # other threads' work past the group before's steps
        self.first_launch: int | None = None  # the lowest runtime call's correlation id so far (lost events)

    def add(self, events, python_calls=(), *, last: bool = True) -> None:
        """Summarise one group's raw events (``last``: no step follows; memory after it is not counted)."""
        with gc_paused():  # ~100k short-lived records, none in a cycle: the cyclic GC's passes would only cost time
            self._add(events, python_calls, last)

    def finish(self) -> TraceSummary:
        bound_timeline(self.out)
        return self.out

    def _add(self, events, python_calls, last: bool) -> None:
        out = self.out
        cpu, device = self.read(events, self.trace_start_ns, out)
        for name, start_ns, end_ns, tid in python_calls:
            out.event_count += 1
            start = (start_ns - self.trace_start_ns) / 1000.0
            cpu.append(Ev(name, start, start + (end_ns - start_ns) / 1000.0, tid, PYTHON, None))
        if device:
            link_runtime_threads(cpu)
        by_thread: dict[int, list[Ev]] = defaultdict(list)
        for ev in cpu:
            by_thread[ev.tid].append(ev)
        markers = sorted((ev for ev in cpu if ev.kind == ANNOTATION and ev.name.startswith(STEP_PREFIX)),
                         key=lambda ev: ev.start)
        before = len(self.windows)
        out.step_us += [ev.end - ev.start for ev in markers]
        out.step_start_us += [ev.start for ev in markers]
        self.windows += [(ev.start, ev.end) for ev in markers]
        if self.main_tid is None and markers:
            self.main_tid = markers[0].tid
        sweep = Sweep(out, self.windows, {id(ev): before + i for i, ev in enumerate(markers)}, shapes=self.shapes,
                      flops=self.flops)
        sweep.op_calls = self.op_calls
        sweep.first_launches = self._first_launches(device)
        sweep.device_reads = {ev.raw.correlation_id() for ev in device if is_copy_to_host(ev.name)} - {0}  # 0: no id
        for tid, evs in by_thread.items():
            sweep.run(evs, MAIN_LANE if tid == self.main_tid else f"CPU thread {tid}")
        self.others_after = discount_waiting(out, (sweep.bars, sweep.gaps), self.windows[before:], self.others_after)
        memory_levels(out, sweep.memory, self.windows, (self.level, self.base), last)
        self.busy_before = attribute_device(device, out, sweep.links, self.windows, self.busy_before)
        self.first_launch = count_lost_events(device, out, sweep.links, self.first_launch)
        if not last:
            bound_timeline(out)  # at most so many bars per lane between groups too

    def _first_launches(self, device: list[Ev]) -> set[int]:
        """The CUPTI correlation ids of the launches in this group that are a kernel's first in the trace."""
        first: dict[str, int] = {}
        for ev in sorted(device, key=lambda ev: ev.start):
            if ev.name not in self.first_kernels:
                first.setdefault(ev.name, ev.raw.correlation_id())
        self.first_kernels.update(first)
        return set(first.values()) - {0}  # 0: no id

def memory_levels(out: TraceSummary, records: list[tuple[float, str, int]], windows, levels: tuple[dict, dict],
                  last: bool) -> None:
    """Peak and final allocation level per device above the first step's start, in time order across
    threads: on CUDA, backward allocates on the autograd thread while the main thread's tensors live.
    Memory may be recorded from before the steps (run.py starts the profiler a warm-up step early: the
    CPU profiler reports no free of a block allocated before it started, so the gradients zero_grad
    frees would otherwise never leave the level); only the steps' records make the peak, and none after
    the last step.  ``levels``: each device's bytes allocated so far and its level at the first step's
    start, carried from one group of steps to the next (``last``: no step follows)."""
    if not windows:
        return
    level, base = levels
    start, end = windows[0][0], windows[-1][1] if last else math.inf
    for t, device, nbytes in sorted(records, key=lambda r: r[0]):
        if t > end:
            break
        if t >= start:
            base.setdefault(device, level[device])
        level[device] += nbytes
        if t >= start:
            out.peak_allocated[device] = max(out.peak_allocated.get(device, 0), level[device] - base[device])
    out.allocated_net = {device: level[device] - base[device] for device in base}


def discount_waiting(out: TraceSummary, swept: tuple[dict, list], windows, before=()) -> list[tuple[float, float]]:
    """The main thread's gaps count as Python ("other") unless another thread worked meanwhile:
    on CUDA, backward runs on an autograd thread while the main thread waits for it.  The same holds
    for the Python time after each op called from Python.  ``swept``: the group's timeline bars by lane and
    the Python gaps (index, start, end) a sweep found; ``before``: other threads' work that began in the
    group of steps before; returns what of it and of this group's runs past its steps."""
    bars, python_gaps = swept  # each lane's bars: (start, end) pairs, or a tensor of them (the columnar summary's)
    others = IntervalSet.of(torch.cat([as_set(ivs) for lane, ivs in bars.items() if lane != MAIN_LANE]
                                      + [as_set(list(before))]))
    worked = others.within_each([(start, end) for _, start, end in python_gaps]) if python_gaps else []
    for (index, start, end), meanwhile in zip(python_gaps, worked):
        out.python_gap_us[index] += end - start - meanwhile
    starts, ends = others.merged()
    if not starts:
        return []
    gaps = IntervalSet.of(windows).minus(IntervalSet.of(bars.get(MAIN_LANE, [])))
    out.category_us[OTHER] = max(out.category_us[OTHER] - gaps.overlap(others), 0.0)
    end = windows[-1][1] if windows else -math.inf
    return [(max(start, end), stop) for start, stop in zip(starts, ends) if stop > end]
