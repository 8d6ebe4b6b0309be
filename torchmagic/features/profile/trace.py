"""Turn the profiler's raw events into a :class:`TraceSummary` the diagnosis rules can read.

We read kineto's raw events rather than ``prof.events()``/``key_averages()``: building
torch's FunctionEvent tree costs ~90 µs an event (11 s for 125k events on our CI machine),
while one sweep over the raw events here costs a few µs each.

One sweep per CPU thread, over events sorted by start, keeps a stack of open events.
From it each event gets its parent, its self time (duration minus children), and the
inherited context that decides where its self time belongs:

* the *phase* it runs in: data loading (``enumerate(DataLoader)...__next__``), backward
  (``autograd::engine::evaluate_function``) or optimizer (``Optimizer.step#``/``zero_grad#``),
* whether it is inside a host-device sync op (``.item()``, ``nonzero`` ...) or a copy op,
* the step it belongs to (``ProfilerStep#N`` markers), and the innermost user source frame
  when the python tracer ran (``--stack``).

The steps, each in its own module: events.py (raw events to light records), sweep.py (the per-thread
pass), device_attribution.py (kernels to the ops that launched them), timeline.py (the bars, bounded),
and here what the threads' sweeps gathered, taken together: memory levels, and Python time another
thread overlapped.  The result is summary.py's TraceSummary, in categories.py's categories.
"""

from __future__ import annotations

from collections import defaultdict

from ...core.gc_pause import gc_paused
from .categories import OTHER
from .device_attribution import attribute_device, count_lost_events
from .events import ANNOTATION, PYTHON, Ev, first_launches, link_runtime_threads, read_events
from .intervals import near, overlap, subtract, union
from .kineto import STEP_PREFIX
from .summary import TraceSummary
from .sweep import Sweep
from .timeline import bound_timeline


def summarize_trace(events, trace_start_ns: int, *, shapes: bool = False, flops: bool = False,
                    python_calls=()) -> TraceSummary:
    """Build the summary from kineto's raw events (``prof.profiler.kineto_results.events()``), and
    the Python tracer's calls where this torch keeps them apart (``activity.python_calls``)."""
    # ~100k short-lived records, none in a cycle: the cyclic GC's passes would only cost time
    with gc_paused():
        return _summarize(events, trace_start_ns, shapes, flops, python_calls)


def _summarize(events, trace_start_ns: int, shapes: bool, flops: bool, python_calls) -> TraceSummary:
    out = TraceSummary()
    cpu, device = read_events(events, trace_start_ns, out)
    for name, start_ns, end_ns, tid in python_calls:
        out.event_count += 1
        start = (start_ns - trace_start_ns) / 1000.0
        cpu.append(Ev(name, start, start + (end_ns - start_ns) / 1000.0, tid, PYTHON, None))
    if device:
        link_runtime_threads(cpu)
    by_thread: dict[int, list[Ev]] = defaultdict(list)
    for ev in cpu:
        by_thread[ev.tid].append(ev)
    markers = sorted((ev for ev in cpu if ev.kind == ANNOTATION and ev.name.startswith(STEP_PREFIX)),
                     key=lambda ev: ev.start)
    out.step_us = [ev.end - ev.start for ev in markers]
    out.step_start_us = [ev.start for ev in markers]
    windows = [(ev.start, ev.end) for ev in markers]
    main_tid = markers[0].tid if markers else None
    sweep = Sweep(out, windows, {id(ev): i for i, ev in enumerate(markers)}, shapes=shapes, flops=flops)
    sweep.first_launches = first_launches(device)
    sweep.device_reads = {ev.raw.correlation_id() for ev in device if "DtoH" in ev.name} - {0}  # 0: no id
    for tid, evs in by_thread.items():
        sweep.run(evs, "CPU main thread" if tid == main_tid else f"CPU thread {tid}")
    _discount_waiting(out, sweep, windows)
    _memory_levels(out, sweep.memory, windows)
    attribute_device(device, out, sweep, windows)
    count_lost_events(device, out, sweep)
    bound_timeline(out)
    return out


def _memory_levels(out: TraceSummary, records: list[tuple[float, str, int]], windows) -> None:
    """Peak and final allocation level per device above the first step's start, in time order across
    threads: on CUDA, backward allocates on the autograd thread while the main thread's tensors live.
    Memory may be recorded from before the steps (run.py starts the profiler a warm-up step early: the
    CPU profiler reports no free of a block allocated before it started, so the gradients zero_grad
    frees would otherwise never leave the level); only the steps' records make the peak."""
    if not windows:
        return
    level: dict[str, int] = defaultdict(int)
    base: dict[str, int] = {}
    start, end = windows[0][0], windows[-1][1]
    for t, device, nbytes in sorted(records, key=lambda r: r[0]):
        if t > end:
            break
        if t >= start:
            base.setdefault(device, level[device])
        level[device] += nbytes
        if t >= start:
            out.peak_allocated[device] = max(out.peak_allocated.get(device, 0), level[device] - base[device])
    out.allocated_net = {device: level[device] - base[device] for device in base}


def _discount_waiting(out: TraceSummary, sweep: Sweep, windows) -> None:
    """The main thread's gaps count as Python ("other") unless another thread worked meanwhile:
    on CUDA, backward runs on an autograd thread while the main thread waits for it.  The same holds
    for the Python time after each op called from Python."""
    others = union(iv for lane, ivs in sweep.bars.items() if lane != sweep.main_lane for iv in ivs)
    for index, start, end in sweep.gaps:
        out.python_gap_us[index] += end - start - (overlap([(start, end)], near(others, start, end)) if others else 0.0)
    if not others:
        return
    gaps = list(subtract(union(windows), union(sweep.bars.get(sweep.main_lane, []))))
    out.category_us[OTHER] = max(out.category_us[OTHER] - overlap(gaps, others), 0.0)
