"""Give each kernel and memcpy of a trace to the op (or user range) that launched it, and measure the
device's time in the profiled steps and what data loading left it idle."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .categories import OTHER
from .events import Ev
from .intervals import intersection, overlap, union
from .kineto import is_pageable_upload
from .result import TimelineSpan as Span
from .summary import OpStats, TraceSummary


@dataclass
class DeviceLinks:
    """What the host side of a group of steps tells about its device work, as the sweep found it (the columnar
    summary holds the same as tensors: traces/columnar_device.py).  Kineto links a kernel to its op by the op's
    ``External id`` (an op's correlation id here) and to its runtime call by CUPTI's correlation id."""

    op_of_corr: dict[int, tuple[str, str, str | None]] = field(default_factory=dict)  # -> (op, category, precision)
    # CUPTI correlation id of a launch no op encloses -> (its innermost user range or None, category)
    launches: dict[int, tuple[str | None, str]] = field(default_factory=dict)
    misaligned: dict[int, str] = field(default_factory=dict)  # op's id -> "MxKxN" of a 16-bit matmul off the grain
    launch_end: dict[int, float] = field(default_factory=dict)  # CUPTI correlation id -> when the launch returned
    launched_in_step: dict[int, bool] = field(default_factory=dict)  # ... of a runtime call -> made in a step
    fp32_call_of_corr: dict = field(default_factory=dict)  # an fp32 matmul's op id -> its call (OpCall)
    data_intervals: list[tuple[float, float]] = field(default_factory=list)  # data loading in the steps
    flop_owner: dict[int, str] | None = None  # --flops: an op's id -> the counted op above it


class Busy(NamedTuple):
    """A group of steps' device intervals, for the next group (summarizer.py): all, those the steps count,
    and those of kernels without a launch in the trace that run past the group's last step."""

    all: Sequence[tuple[float, float]] = ()
    steps: Sequence[tuple[float, float]] = ()
    after: Sequence[tuple[float, float]] = ()


def attribute_device(device: list[Ev], out: TraceSummary, links: DeviceLinks, windows, before: Busy = Busy()) -> Busy:
    """Give each kernel/memcpy to the op that launched it, or where no op did, to the user range
    around its launch; measure the device time of the steps: the union of the kernels the steps
    launched, wherever they ran (a host ahead of its GPU leaves the last steps' kernels running after
    the profiled window), and where the launch is not in the trace, of the kernels run inside the steps.
    Fed group of steps after group (summarizer.py): ``before``, the group before's busy time, counted once."""
    if not device and not before.after:
        return Busy()
    out.has_device_events = True
    intervals, launched_in_steps, unlinked = [], [], []
    fp32_calls = set()
    for ev in device:
        dur = ev.end - ev.start
        op, category, precision = links.op_of_corr.get(ev.corr, (None, OTHER, None))
        if op is None and links.launches:
            op, category = links.launches.get(ev.raw.correlation_id(), (None, OTHER))
        if op is not None:
            stats = out.ops.get(op)
            if stats is None:
                stats = out.ops[op] = OpStats(op)
            stats.self_device_us += dur
        owner = links.flop_owner.get(ev.corr) if links.flop_owner is not None else None
        if owner is not None and owner in out.ops:
            out.ops[owner].flop_device_us += dur
        if precision == "low":
            out.matmul_low_device_us += dur
            shape = links.misaligned.get(ev.corr)
            if shape is not None:
                out.misaligned_matmul_device_us += dur
                out.misaligned_shapes[shape] += dur
        elif precision == "fp32":
            out.matmul_fp32_device_us += dur
            fp32_calls.add(ev.corr)
            call = links.fp32_call_of_corr.get(ev.corr)
            if call is not None:
                out.fp32_matmuls[call][2] += dur
        out.kernel_us.append(dur)
        launched = links.launch_end.get(ev.raw.correlation_id())
        if launched is not None:
            out.launch_delay_us.append(max(ev.start - launched, 0.0))
        out.device_category_us[category] += dur
        out.device_kernels += 1
        if is_pageable_upload(ev.name):
            out.pageable_h2d += 1
            out.pageable_h2d_us += dur
        intervals.append((ev.start, ev.end))
        in_step = links.launched_in_step.get(ev.raw.correlation_id() or None)
        if in_step:
            launched_in_steps.append((ev.start, ev.end))
        elif in_step is None:  # its runtime call is not in the trace
            unlinked.append((ev.start, ev.end))
        out.timeline.append(Span(f"GPU stream {ev.tid}", ev.start, dur, category, ev.name))
    out.matmul_fp32_device_calls += len(fp32_calls)
    return _busy_time(out, links, windows, before, (intervals, launched_in_steps, unlinked))


def _busy_time(out: TraceSummary, links: DeviceLinks, windows, before: Busy, kernels: tuple[list, list, list]) -> Busy:
    """The device time of the steps and what data loading left idle, from the kernels' intervals: all,
    those launched in the steps, those whose launch is not in the trace."""
    intervals, launched_in_steps, unlinked = kernels
    busy, unlinked = union(intervals), union(unlinked + list(before.after))
    steps_busy = union(launched_in_steps + list(intersection(unlinked, union(windows))))
    out.device_busy_us += sum(end - start for start, end in steps_busy) - overlap(steps_busy, before.steps)
    data = union(links.data_intervals)
    exposed = sum(end - start for start, end in data) - overlap(data, union(busy + list(before.all)))
    out.data_exposed_us = (out.data_exposed_us or 0.0) + exposed
    end = windows[-1][1] if windows else -math.inf
    return Busy(busy, steps_busy, [(max(start, end), stop) for start, stop in unlinked if stop > end])


def count_lost_events(device: list[Ev], out: TraceSummary, links: DeviceLinks, first: int | None = None) -> int | None:
    """Kernels (and copies) whose runtime call is not in the trace, and kernel launches made in the steps
    whose kernel is not: CUPTI pairs them by correlation id, so either side missing is an event lost.
    CUPTI numbers calls in order, so a kernel numbered below the trace's first runtime call was launched
    before the trace began (a queue the GPU was still running: 614 kernels in HTA's trace_diff trace), not
    lost.  A trace with no runtime call at all recorded only the device's side: nothing is counted there.
    Fed group after group (summarizer.py), the counts add up, and ``first`` is the lowest runtime call of
    the groups so far (returned, with this group's)."""
    if links.launched_in_step:
        first = min(links.launched_in_step) if first is None else min(first, min(links.launched_in_step))
    if not device or first is None:
        return first
    ran = {ev.raw.correlation_id() for ev in device}
    out.kernels_without_launch += sum(1 for corr in (ev.raw.correlation_id() for ev in device)
                                      if corr > first and corr not in links.launched_in_step)
    launches = [corr for corr in links.launch_end if links.launched_in_step.get(corr)]
    out.kernel_launches += len(launches)
    out.launches_without_kernel += sum(1 for corr in launches if corr not in ran)
    return first
