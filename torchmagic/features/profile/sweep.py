"""The per-thread sweep over a trace's CPU events in start order: a stack of open events gives each
its parent, its self time (duration less its children's) and the context that decides where that
self time belongs (trace.py's docstring), and adds it up into the summary as each event closes."""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict

from torch.autograd import DeviceType

from ...core.measure.low_precision import OpCall, freeze
from .categories import (BACKWARD, COPIES, COPY_OPS, DATA, FORWARD, LOW_PRECISION_DTYPES, NO_KERNEL_OPS, OPTIMIZER,
                         OTHER, START_UP, SYNC_OPS, SYNC_RUNTIME, SYNCS, phase_of)
from .device_attribution import DeviceLinks
from .events import ANNOTATION, MEMORY, OP, PYTHON, RUNTIME, Ev
from .flops import FlopAttribution
from .frames import is_library_frame, is_user_frame
from .kineto import FIRST_COMPILE, LAUNCH_CALLS, START_UP_MIN_US, is_backward_node, one_time_cost
from .result import TimelineSpan as Span
from .summary import OpStats, TraceSummary
from .traffic import MATMUL_OPS, off_tensor_core_grain, tensor_traffic

MAIN_LANE = "CPU main thread"  # the timeline lane of the thread the steps ran on
MAX_MATMUL_CALLS = 4096  # distinct fp32 matmul calls kept (shapes that vary every step would grow it unbounded)


def _category(kind, name, phase, in_sync, in_copy) -> str:
    if phase is not None:
        return phase
    if in_sync or (kind == RUNTIME and name in SYNC_RUNTIME):
        return SYNCS
    if in_copy:
        return COPIES
    if kind in (OP, RUNTIME):
        return FORWARD
    return OTHER  # Python between ops, and user annotations' own time


def matmul_precision(raw) -> str | None:
    dtypes = raw.dtypes()
    if not dtypes:
        return None
    if dtypes[0] in LOW_PRECISION_DTYPES:
        return "low"
    return "fp32" if dtypes[0] == "float" else None


def _op_call(ev: Ev) -> OpCall:
    raw = ev.raw
    concrete = getattr(raw, "concrete_inputs", None)
    shapes = freeze(raw.shapes())
    return OpCall(ev.name, shapes, freeze(raw.dtypes()),
                  freeze(concrete()) if concrete is not None else (None,) * len(shapes))


def _window_of(windows: list[tuple[float, float]], t: float) -> int | None:
    i = bisect.bisect_right(windows, (t, math.inf)) - 1
    return i if i >= 0 and windows[i][0] <= t < windows[i][1] else None


class Sweep:
    """The per-thread pass: a stack of open events, each with the context its children inherit."""

    def __init__(self, out: TraceSummary, windows, marker_index: dict[int, int], *, shapes: bool, flops: bool):
        self.out = out
        self.shapes = shapes
        self.windows = windows
        self.marker_index = marker_index
        self.flop_counts = FlopAttribution() if flops else None  # --flops (flops.py)
        # what the device's events are linked to (device_attribution.py)
        self.links = DeviceLinks(flop_owner=self.flop_counts.owner_of_corr if flops else None)
        self.memory: list[tuple[float, str, int]] = []  # (time, device, bytes) of each allocation/free
        self.bars: dict[str, list[tuple[float, float]]] = defaultdict(list)  # lane -> top-level intervals
        self.last_python: tuple[int, float, int] | None = None  # (index, end, step) of the thread's last Python op
        self.gaps: list[tuple[int, float, float]] = []  # (index of a Python op, start, end) of the Python after it
        self.one_time: dict[int, str] = {}  # id() of a runtime call that is a one-time cost -> its kind
        self.first_launches: set[int] = set()  # CUPTI correlation ids of each kernel's first launch
        self.device_reads: set[int] = set()  # ... of device-to-host copies
        self.op_calls: Counter = Counter()  # op name -> calls opened so far

    def run(self, evs: list[Ev], lane: str) -> None:
        out, close, marker_of, flop_counts = self.out, self._close, self.marker_index.get, self.flop_counts
        self.last_python = None
        evs.sort(key=lambda ev: (ev.start, -ev.end))
        # An open event: [ev, child_us, phase, in_sync, in_copy, step, top, frame, under_op, library]
        stack: list[list] = []
        for ev in evs:
            while stack and stack[-1][0].end <= ev.start:
                close(stack.pop(), lane)
            parent = stack[-1] if stack else None
            if ev.kind == MEMORY:
                _memory(out, self.memory, self.windows, ev, parent)
                continue
            name, kind = ev.name, ev.kind
            if parent is None:
                phase, in_sync, in_copy, step, top, frame, under_op, library = (None, False, False, None, None, None,
                                                                                 False, None)
            else:
                parent[1] += ev.end - ev.start
                _, _, phase, in_sync, in_copy, step, top, frame, under_op, library = parent
            marker = marker_of(id(ev))
            if marker is not None:
                step, top = marker, None
            elif parent is None:
                step = _window_of(self.windows, ev.start)  # work on other threads, placed by time
                top = ev if step is not None else None
            elif top is None and step is not None:
                top = ev  # a direct child of the step marker
            if top is ev:
                ev.cats = {}
            own_phase = phase_of(name)
            if own_phase is not None:
                self.last_python = None  # the time until the next Python op is this phase's, not Python's
                if phase is None or own_phase == START_UP:  # a compile inside any phase
                    phase = own_phase
                    if own_phase == BACKWARD:
                        out.backward_events += 1
                    elif own_phase == OPTIMIZER and kind == ANNOTATION:
                        out.optimizer_names.add(name.split("#", 1)[1].split(".", 1)[0])
                    elif own_phase == DATA and step is not None:
                        self.links.data_intervals.append((ev.start, ev.end))
            if flop_counts is not None:
                flop_counts.opened(ev, parent[0] if parent is not None else None, ev.kind == OP)
            if kind == PYTHON and is_user_frame(name):
                frame, library = name, None
            elif kind == PYTHON and frame is not None and library is None and is_library_frame(name):
                library = name  # the library call the user's code made: a loop of its own may be in there
            if kind == OP:
                self.op_calls[name] += 1
                # a sync or copy the user asked for, not one inside another op's implementation
                in_sync = in_sync or (name in SYNC_OPS and not under_op)
                in_copy = in_copy or (name in COPY_OPS and not under_op)
                if step is not None:
                    self._op_opened(ev, step, phase, frame, under_op, library)
            entry = [ev, 0.0, phase, in_sync, in_copy, step, top, frame, under_op or kind == OP, library]
            if kind == RUNTIME:
                self._runtime_opened(entry, stack)
            stack.append(entry)
        while stack:
            self._close(stack.pop(), lane)

    def _runtime_opened(self, entry: list, stack: list[list]) -> None:
        """A runtime call opened (``entry``, not on ``stack`` yet): note when a launch returned and whether
        it was made in a step; a copy to the host makes it (and what it encloses) a sync."""
        ev, _, phase, in_sync, in_copy, step, _, _, under_op, _ = entry
        out, name, dur = self.out, ev.name, ev.end - ev.start
        corr = ev.raw.correlation_id()
        if name in LAUNCH_CALLS:
            self.links.launch_end[corr] = ev.end
        if corr:
            self.links.launched_in_step[corr] = step is not None
        if corr in self.device_reads and not in_sync:
            # a copy to the host (.cpu(), .tolist(), print) waits for the GPU to get there: a sync
            in_sync = entry[3] = True
            if step is not None and phase is None:
                out.device_read_calls += 1
                out.device_read_us += dur
        if dur >= START_UP_MIN_US:
            self._one_time(ev, stack[-1] if stack else None)
        if step is not None and name in SYNC_RUNTIME and phase is None and not in_sync:
            out.sync_runtime_calls += 1  # explicit torch.cuda.synchronize() and friends
            out.sync_runtime_us += dur
        if step is not None and not under_op:
            self._launch_outside_ops(ev, stack, _category(RUNTIME, name, phase, in_sync, in_copy))

    def _one_time(self, ev: Ev, parent) -> None:
        """Mark a slow runtime call that is a one-time cost (kineto.one_time_cost)."""
        op = parent[0] if parent is not None and parent[0].kind == OP else None
        kind = one_time_cost(ev.name, ev.end - ev.start, op is not None and self.op_calls[op.name] == 1,
                             ev.name in LAUNCH_CALLS and ev.raw.correlation_id() in self.first_launches)
        if kind is not None:
            self.one_time[id(ev)] = kind

    def _launch_outside_ops(self, ev: Ev, stack: list[list], category: str) -> None:
        """A runtime call no op encloses (a custom extension's or a hand-written Triton kernel's launch
        under record_function): kineto links kernels to ops only, so remember the launch's innermost
        user range and category for its kernels, found by CUPTI's correlation id that they share."""
        corr = ev.raw.correlation_id()
        if corr:
            user_range = next((entry[0].name for entry in reversed(stack)
                               if entry[0].kind == ANNOTATION and id(entry[0]) not in self.marker_index), None)
            self.links.launches[corr] = (user_range, category)

    def _op_opened(self, ev: Ev, step: int, phase, frame, under_op, library) -> None:
        out, name, dur = self.out, ev.name, ev.end - ev.start
        if not under_op and phase != DATA and name not in NO_KERNEL_OPS:
            out.launching_ops += 1
        backward_node = phase == BACKWARD and is_backward_node(name)
        seq = ev.raw.sequence_nr() if phase is None or backward_node else -1
        if phase is None and not under_op:  # called straight from Python
            if self.last_python is not None and self.last_python[2] == step and ev.start > self.last_python[1]:
                self.gaps.append((self.last_python[0], self.last_python[1], ev.start))
            self.last_python = (len(out.python_op_us), ev.end, step)
            out.python_ops += 1
            out.python_op_us.append(dur)
            out.python_op_nodes.append(seq)
            out.python_op_sync.append(name in SYNC_OPS)
            out.python_gap_us.append(0.0)
            if frame is not None:
                out.hot_lines[frame] += dur
            if library is not None:
                out.python_ops_in_library[library] += 1
            if name in SYNC_OPS:
                out.sync_calls += 1
                out.sync_us += dur
                if library is not None:
                    out.syncs_in_library[library] += 1
        if phase is None:
            if seq >= 0:
                out.graph_nodes.add(seq)
                if not under_op:
                    out.graph_node_us[seq] = out.graph_node_us.get(seq, 0.0) + dur
        elif backward_node:
            # seq: the forward node this backward function computes the gradient of
            if seq >= 0:
                out.backward_nodes.add(seq)
        if phase == OPTIMIZER:
            out.optimizer_ops += 1
            if "_fused_" in name:
                out.optimizer_fused = True
            elif "_foreach_" in name:
                out.optimizer_foreach = True
        if name == "aten::contiguous":
            out.layout_copies += 1

    def _close(self, entry, lane: str) -> None:
        ev, child_us, phase, in_sync, in_copy, step, top, _, _, _ = entry
        flops = self.flop_counts.closed(ev) if self.flop_counts is not None else 0
        if step is None:
            return  # outside the profiled steps (profiler start and stop)
        out, name, kind = self.out, ev.name, ev.kind
        dur = ev.end - ev.start
        self_us = dur - child_us
        if self_us < 0.0:  # as max(self_us, 0.0) keeps it
            self_us = 0.0
        is_step = top is None  # only a step marker has a step but no bar above it
        one_time = self.one_time.get(id(ev)) if kind == RUNTIME else None
        if one_time is not None:
            category = START_UP
        else:
            category = OTHER if is_step else _category(kind, name, phase, in_sync, in_copy)
            one_time = FIRST_COMPILE if category == START_UP else None
        if one_time is not None:
            out.one_time_us[one_time] = out.one_time_us.get(one_time, 0.0) + self_us
        out.category_us[category] += self_us
        if top is not None:
            cats = top.cats
            cats[category] = cats.get(category, 0.0) + self_us
            if top is ev:
                dominant = max(cats, key=cats.get)
                out.timeline.append(Span(lane, ev.start, dur, dominant, name))
                self.bars[lane].append((ev.start, ev.end))
        if kind == PYTHON or is_step:
            return
        if category == OPTIMIZER:
            out.optimizer_us += self_us
        elif category == DATA:
            out.data_us += self_us
        elif category == COPIES:
            out.copy_us += self_us
        stats = out.ops.get(name)
        if stats is None:
            stats = out.ops[name] = OpStats(name)
        stats.calls += 1
        stats.self_cpu_us += self_us
        stats.total_cpu_us += dur
        if kind != OP:
            return
        precision = self._matmul_closed(ev, category, self_us) if name in MATMUL_OPS else None
        if ev.corr:
            self.links.op_of_corr[ev.corr] = (name, category, precision)
        if self.flop_counts is not None:
            _count_traffic(stats, ev, flops)
        if self.shapes:
            stats.shapes[shape_text(ev.raw.shapes())] += self_us

    def _matmul_closed(self, ev: Ev, category: str, self_us: float) -> str | None:
        """Add a matmul/conv's self time to its precision's, note a 16-bit one off the tensor cores' grain,
        and keep each distinct fp32 call for the amp rule; returns the precision ("low", "fp32" or None)."""
        out = self.out
        precision = matmul_precision(ev.raw)
        if precision == "low":
            out.matmul_low_us += self_us
            shape = off_tensor_core_grain(ev.name, ev.raw.shapes()) if ev.corr else None
            if shape is not None:
                self.links.misaligned[ev.corr] = shape
        elif precision == "fp32":
            out.matmul_fp32_us += self_us
            out.matmul_fp32_calls += 1
            call = _op_call(ev)
            if count_fp32_call(out, call, self_us, category == FORWARD) is not None:
                if ev.corr:
                    self.links.fp32_call_of_corr[ev.corr] = call
        return precision


def count_fp32_call(out: TraceSummary, call: OpCall, self_us: float, forward: bool) -> list | None:
    """A distinct fp32 matmul/conv call's totals ([calls, self CPU µs, GPU µs, calls in the forward]) with this
    call added; None past MAX_MATMUL_CALLS distinct calls."""
    totals = out.fp32_matmuls.get(call)
    if totals is None and len(out.fp32_matmuls) < MAX_MATMUL_CALLS:
        totals = out.fp32_matmuls[call] = [0, 0.0, 0.0, 0]
    if totals is not None:
        totals[0] += 1
        totals[1] += self_us
        totals[3] += forward
    return totals


def _memory(out: TraceSummary, records: list[tuple[float, str, int]], windows, ev: Ev, parent) -> None:
    """An allocation (bytes > 0) or a free: kept in ``records`` for trace.py's levels; an allocation in
    a step counts toward its device's total and to the op that made it."""
    out.memory_recorded = True
    device = device_label(ev.raw.device_type(), ev.raw.device_index())
    nbytes = ev.raw.nbytes()
    records.append((ev.start, device, nbytes))
    if nbytes > 0 and _window_of(windows, ev.start) is not None:
        out.allocated_total[device] = out.allocated_total.get(device, 0) + nbytes
        if parent is not None and parent[0].kind == OP:
            stats = out.ops.get(parent[0].name)
            if stats is None:
                stats = out.ops[parent[0].name] = OpStats(parent[0].name)
            stats.allocated_bytes += nbytes


def device_label(device_type: DeviceType, index: int) -> str:
    """A memory record's device, per device and never summed across GPUs: "cuda:1", as a Device's label reads."""
    return "cpu" if device_type == DeviceType.CPU else f"{str(device_type).rsplit('.', 1)[-1].lower()}:{max(index, 0)}"


def shape_text(shapes) -> str:
    return ", ".join(f"[{', '.join(map(str, s))}]" if isinstance(s, list) else str(s) for s in shapes if s != [])


def _count_traffic(stats: OpStats, ev: Ev, flops: int) -> None:
    """--flops: an op's counted FLOPs, the bytes its tensors hold, and FLOPs estimated for pointwise ops."""
    stats.flops += flops
    moved, dtype, pointwise_flops = tensor_traffic(ev.name, ev.raw.shapes(), ev.raw.dtypes())
    stats.bytes += moved
    stats.dtype = stats.dtype or dtype
    stats.estimated_flops += pointwise_flops
