"""The operator report's summary of a host-only trace computed over its columns (columns.py), the same
TraceSummary the sweep (profile/sweep.py, through summarizer.py) makes of the same events, without a Python
step per event: the nesting from tree.py, then what each event inherits from its ancestors a depth at a time,
then every total as a masked sum.  What the sweep reads that host-only traces without shapes lack (kernels,
runtime calls, memory, Python frames, shapes, FLOPs) is not here: columns.py gives those traces up to it.

Times are the sweep's own floats (µs since the first event, made by the same operations), so nesting and
windows come out the same; sums are taken in another order, so totals may differ from the sweep's in their
last bits (tests/profile/traces/test_columnar.py holds them to 1e-6 µs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....core.measure.low_precision import OpCall, freeze
from ..categories import (BACKWARD, CATEGORIES, COPIES, COPY_OPS, DATA, FORWARD, NO_KERNEL_OPS, OPTIMIZER, OTHER,
                          START_UP, SYNC_OPS, SYNCS, phase_of)
from ..events import ANNOTATION, OP
from ..kineto import CPU_OP, FIRST_COMPILE, STEP_PREFIX, USER_ANNOTATION, is_backward_node
from ..result import TimelineSpan as Span
from ..sweep import MAX_MATMUL_CALLS, matmul_precision, shape_text
from ..traffic import MATMUL_OPS
from ..summarizer import discount_waiting
from ..summary import OpStats, TraceSummary
from ..timeline import bound_timeline
from .columns import EventKind, TraceColumns
from .fields import literal
from .tree import EventTree, event_tree

_CATEGORY = {category: code for code, category in enumerate(CATEGORIES)}
MAIN_LANE = "CPU main thread"


@dataclass
class _Events:
    """The host events the sweep reads, in its visiting order (thread by thread)."""

    kind: torch.Tensor     # code into ``names``' table of kinds
    start: torch.Tensor    # µs since the trace's first event, as the sweep's floats
    end: torch.Tensor
    thread: torch.Tensor   # index into ``tids``, in the order threads first appear
    sequence: torch.Tensor
    inputs: torch.Tensor   # code into ``input_lists``
    tree: EventTree
    kinds: list[EventKind]
    tids: list
    lanes: list[str]       # each thread's timeline lane (index: ``thread``)
    input_lists: list
    shapes: bool           # an op with shapes was read: each op's time is kept by its shapes


def columnar_summary(columns: TraceColumns) -> tuple[TraceSummary, int, bool]:
    """The summary of the trace's events over all its steps, its first event's start (ns), and whether an op
    had shapes recorded."""
    out = TraceSummary()
    events, first_ns = _events(columns, out)
    names = _names(events.kinds)
    step_rows, windows = _steps(events, names)
    out.step_us += [end - start for start, end in windows]
    out.step_start_us += [start for start, _ in windows]
    context = _context(events, names, step_rows, windows)
    events.lanes = _lanes(events, step_rows)
    bars = _closed(out, events, names, context)
    gaps = _opened(out, events, names, context)
    discount_waiting(out, _SweepLike(bars, MAIN_LANE, gaps), windows)
    bound_timeline(out)
    return out, first_ns, events.shapes


def _events(columns: TraceColumns, out: TraceSummary) -> tuple[_Events, int]:
    """The host events (ops and user ranges) in visiting order; with no step marker, one made around the
    whole trace on the thread that ran most ops, as ops.py's ``_whole_trace_marker`` makes it."""
    ts, dur = _tensor(columns.ts, torch.float64), _tensor(columns.dur, torch.float64)
    start_ns, dur_ns = (ts * 1000).round().long(), (dur * 1000).round().long()
    kind, thread = _tensor(columns.kind, torch.long), _tensor(columns.thread, torch.long)
    sequence, kinds, tids = _tensor(columns.sequence, torch.long), list(columns.kinds), list(columns.threads)
    inputs = _tensor(columns.inputs, torch.long)
    ops = torch.tensor([k.cat == CPU_OP for k in kinds], dtype=torch.bool)[kind]
    shaped = torch.tensor([bool(shapes) for shapes, _, _ in columns.input_lists], dtype=torch.bool)
    shapes = bool(shaped[inputs[ops]].any())
    first_ns = int(start_ns.min())
    out.event_count = len(start_ns)
    if not columns.steps:
        marker_ns, tid = _whole_trace_marker(kinds, kind, thread, tids, start_ns + dur_ns, first_ns)
        if tid not in tids:
            tids.append(tid)
        kinds.append(EventKind(f"{STEP_PREFIX}0", USER_ANNOTATION, ANNOTATION))
        start_ns, dur_ns = torch.cat([start_ns, marker_ns[:1]]), torch.cat([dur_ns, marker_ns[1:]])
        kind = torch.cat([kind, torch.tensor([len(kinds) - 1])])
        thread = torch.cat([thread, torch.tensor([tids.index(tid)])])
        sequence, inputs = torch.cat([sequence, torch.tensor([-1])]), torch.cat([inputs, torch.tensor([0])])
        out.event_count += 1
    light = torch.tensor([-1 if k.kind is None else k.kind for k in kinds], dtype=torch.long)[kind]
    host = ((light == OP) | (light == ANNOTATION)).nonzero().flatten()
    start = (start_ns[host] - first_ns).double() / 1000.0
    end = start + dur_ns[host].double() / 1000.0
    lane, codes = _first_seen_order(thread[host])
    tree = event_tree(lane, start, end)
    at = host[tree.order]
    return _Events(kind[at], start[tree.order], end[tree.order], lane[tree.order], sequence[at], inputs[at], tree,
                   kinds, [tids[code] for code in codes.tolist()], [], columns.input_lists, shapes), first_ns


def _tensor(values, dtype: torch.dtype) -> torch.Tensor:
    return torch.frombuffer(values, dtype=dtype).clone() if len(values) else torch.empty(0, dtype=dtype)


def _first_seen_order(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each code renumbered in the order codes first appear, and the codes in that order."""
    unique, inverse = torch.unique(codes, return_inverse=True)
    first = torch.full((len(unique),), len(codes)).scatter_reduce_(0, inverse, torch.arange(len(codes)), "amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    return rank[inverse], unique[order]


def _whole_trace_marker(kinds, kind, thread, tids, ends_ns, first_ns) -> tuple[torch.Tensor, object]:
    """ops.py's ``_whole_trace_marker``: the trace's span, on the thread that ran most ops (the first seen of
    those tied), as a (start, duration) in ns made by its operations, and that thread's tid (0 with no op)."""
    is_op = torch.tensor([k.cat == CPU_OP for k in kinds], dtype=torch.bool)[kind]
    ops = thread[is_op]
    tid = 0
    if len(ops):
        counts = torch.bincount(ops, minlength=len(tids))
        tied = (counts == counts.max()).nonzero().flatten()
        first = [int((ops == code).nonzero()[0]) for code in tied.tolist()]
        tid = tids[int(tied[first.index(min(first))])]
    end = int(ends_ns.max())
    ts, span = first_ns / 1000, (end - first_ns) / 1000
    return torch.tensor([round(ts * 1000), round(span * 1000)]), tid


@dataclass
class _Names:
    """Per kind code, what its name says (tensors indexed by the code)."""

    op: torch.Tensor        # an op (not a user range)
    phase: torch.Tensor     # the category of the phase it opens (phase_of), -1 for none
    sync: torch.Tensor      # SYNC_OPS
    copy: torch.Tensor      # COPY_OPS
    no_kernel: torch.Tensor  # NO_KERNEL_OPS
    backward_node: torch.Tensor
    step: torch.Tensor      # a ProfilerStep marker
    name_id: torch.Tensor   # the same id for the same name under another category
    names: list[str]        # name_id -> name


def _names(kinds: list[EventKind]) -> _Names:
    ids: dict[str, int] = {}
    name_id = [ids.setdefault(k.name, len(ids)) for k in kinds]

    def flag(test) -> torch.Tensor:
        return torch.tensor([bool(test(k)) for k in kinds], dtype=torch.bool)

    phases = [phase_of(k.name) for k in kinds]
    return _Names(op=flag(lambda k: k.kind == OP),
                  phase=torch.tensor([-1 if p is None else _CATEGORY[p] for p in phases], dtype=torch.long),
                  sync=flag(lambda k: k.name in SYNC_OPS), copy=flag(lambda k: k.name in COPY_OPS),
                  no_kernel=flag(lambda k: k.name in NO_KERNEL_OPS), backward_node=flag(lambda k: is_backward_node(k.name)),
                  step=flag(lambda k: k.kind == ANNOTATION and k.name.startswith(STEP_PREFIX)),
                  name_id=torch.tensor(name_id, dtype=torch.long), names=list(ids))


def _steps(events: _Events, names: _Names) -> tuple[torch.Tensor, list[tuple[float, float]]]:
    """The step markers' indices, by start (then visiting order, as the sweep's stable sort of the file's
    order has them: events of one start on one thread), and their windows."""
    rows = names.step[events.kind].nonzero().flatten()
    by_file = torch.argsort(events.tree.order[rows], stable=True)  # the summarizer sorts the file's order
    rows = rows[by_file]
    rows = rows[torch.argsort(events.start[rows], stable=True)]
    return rows, list(zip(events.start[rows].tolist(), events.end[rows].tolist()))


@dataclass
class _Context:
    """What each event (visiting order) has when the sweep opens it: the phase it is in, whether an op
    encloses it, whether it is in a sync or a copy the user asked for, its step (-1: outside the steps) and
    its timeline bar (the index of the step's top-level event it is under, -1 for a marker or none), and
    whether its own phase took over (the phase it opens, where none is open or it is a compile)."""

    phase: torch.Tensor
    under_op: torch.Tensor
    in_sync: torch.Tensor
    in_copy: torch.Tensor
    step: torch.Tensor
    top: torch.Tensor
    took: torch.Tensor


def _context(events: _Events, names: _Names, step_rows: torch.Tensor, windows) -> _Context:
    n, parent = len(events.kind), events.tree.parent
    own, is_op = names.phase[events.kind], names.op[events.kind]
    sync_op, copy_op = is_op & names.sync[events.kind], is_op & names.copy[events.kind]
    marker = torch.full((n,), -1, dtype=torch.long)
    marker[step_rows] = torch.arange(len(step_rows))
    ctx = _Context(phase=own.clone(), under_op=torch.zeros(n, dtype=torch.bool), in_sync=sync_op.clone(),
                   in_copy=copy_op.clone(), step=marker.clone(), top=torch.full((n,), -1, dtype=torch.long),
                   took=own >= 0)
    roots = (parent < 0).nonzero().flatten()
    placed = _window_of(windows, events.start[roots])  # work outside a marker, placed by time
    is_marker = marker[roots] >= 0
    ctx.step[roots] = torch.where(is_marker, marker[roots], placed)
    ctx.top[roots] = torch.where(~is_marker & (placed >= 0), roots, -1)
    for at in events.tree.levels():
        up = parent[at]
        phase, mine = ctx.phase[up], own[at]
        took = (mine >= 0) & ((phase < 0) | (mine == _CATEGORY[START_UP]))
        ctx.took[at] = took
        ctx.phase[at] = torch.where(took, mine, phase)
        under = ctx.under_op[up] | is_op[up]
        ctx.under_op[at] = under
        ctx.in_sync[at] = ctx.in_sync[up] | (sync_op[at] & ~under)
        ctx.in_copy[at] = ctx.in_copy[up] | (copy_op[at] & ~under)
        step, top, here = ctx.step[up], ctx.top[up], marker[at]
        ctx.step[at] = torch.where(here >= 0, here, step)
        ctx.top[at] = torch.where(here >= 0, -1, torch.where((top < 0) & (step >= 0), at, top))
    return ctx


def _window_of(windows, t: torch.Tensor) -> torch.Tensor:
    """sweep._window_of over a tensor of times: the window holding each, or -1."""
    if not windows:
        return torch.full_like(t, -1, dtype=torch.long)
    starts = torch.tensor([w[0] for w in windows], dtype=torch.float64)
    ends = torch.tensor([w[1] for w in windows], dtype=torch.float64)
    i = torch.searchsorted(starts, t, right=True) - 1
    inside = (i >= 0) & (t < ends[i.clamp(min=0)])
    return torch.where(inside, i, -1)


def _lanes(events: _Events, step_rows: torch.Tensor) -> list[str]:
    """Each thread's timeline lane: the first step's thread is the main one."""
    main = events.tids[int(events.thread[step_rows[0]])] if len(step_rows) else None
    return [MAIN_LANE if tid == main else f"CPU thread {tid}" for tid in events.tids]


def _closed(out: TraceSummary, events: _Events, names: _Names, ctx: _Context) -> dict:
    """What the sweep adds up as it closes each event in the steps: self time by category, the operator
    table, the timeline's bars (each in its dominant category); returns the bars' intervals by lane."""
    tree, kind = events.tree, events.kind
    length = events.end - events.start
    has = tree.parent >= 0
    self_us = (length - torch.zeros_like(length).scatter_add_(0, tree.parent[has], length[has])).clamp(min=0.0)
    is_step = (ctx.step >= 0) & (ctx.top < 0)  # only a marker has a step but no bar
    category = torch.where(ctx.phase >= 0, ctx.phase, torch.where(ctx.in_sync, _CATEGORY[SYNCS], torch.where(
        ctx.in_copy, _CATEGORY[COPIES], torch.where(names.op[kind], _CATEGORY[FORWARD], _CATEGORY[OTHER]))))
    category = torch.where(is_step, _CATEGORY[OTHER], category)
    closing = tree.close_order()
    closing = closing[ctx.step[closing] >= 0]  # outside the steps nothing is counted
    totals = torch.zeros(len(CATEGORIES), dtype=torch.float64).scatter_add_(0, category[closing], self_us[closing])
    for code, total in enumerate(totals.tolist()):
        out.category_us[CATEGORIES[code]] += total
    if bool((category[closing] == _CATEGORY[START_UP]).any()):
        out.one_time_us[FIRST_COMPILE] = totals[_CATEGORY[START_UP]].item()
    rows = closing[~is_step[closing]]
    _operator_table(out, names, kind[rows], self_us[rows], length[rows])
    ops = rows[names.op[kind[rows]]]
    _inputs(out, events, names, ops, category[ops], self_us[ops])
    for phase, field in ((OPTIMIZER, "optimizer_us"), (DATA, "data_us"), (COPIES, "copy_us")):
        setattr(out, field, getattr(out, field) + float(self_us[rows][category[rows] == _CATEGORY[phase]].sum()))
    return _timeline(out, events, names, ctx.top, (closing, category, self_us))


def _operator_table(out: TraceSummary, names: _Names, kind, self_us, length) -> None:
    """Calls, self and total time per name, in the order names first close (as the sweep's dict has them)."""
    name = names.name_id[kind]
    count = len(names.names)
    calls = torch.bincount(name, minlength=count).tolist()
    own = torch.zeros(count, dtype=torch.float64).scatter_add_(0, name, self_us).tolist()
    total = torch.zeros(count, dtype=torch.float64).scatter_add_(0, name, length).tolist()
    first = torch.full((count,), len(name)).scatter_reduce_(0, name, torch.arange(len(name)), "amin")
    for i in torch.argsort(first).tolist():
        if calls[i]:
            out.ops[names.names[i]] = OpStats(names.names[i], calls=calls[i], self_cpu_us=own[i], total_cpu_us=total[i])


def _inputs(out: TraceSummary, events: _Events, names: _Names, ops, category, self_us) -> None:
    """What ops' inputs decide, over the ops in the steps in closing order: each op's self time by its shapes
    (where shapes were recorded), and matmuls' time by precision, each distinct fp32 call kept for the amp rule
    (at most sweep.MAX_MATMUL_CALLS of them, the first to close)."""
    name, inputs = names.name_id[events.kind[ops]], events.inputs[ops]
    if events.shapes:
        count = len(events.input_lists)
        key = name * count + inputs
        unique, inverse = torch.unique(key, return_inverse=True)
        sums = torch.zeros(len(unique), dtype=torch.float64).scatter_add_(0, inverse, self_us).tolist()
        first = torch.full((len(unique),), len(key)).scatter_reduce_(0, inverse, torch.arange(len(key)), "amin")
        for i in torch.argsort(first).tolist():
            op, code = divmod(int(unique[i]), count)
            out.ops[names.names[op]].shapes[shape_text(events.input_lists[code][0])] += sums[i]
    matmul = torch.tensor([n in MATMUL_OPS for n in names.names], dtype=torch.bool)[name]
    for op, code, forward, us in zip(name[matmul].tolist(), inputs[matmul].tolist(),
                                     (category[matmul] == _CATEGORY[FORWARD]).tolist(), self_us[matmul].tolist()):
        shapes, dtypes, concrete = events.input_lists[code]
        precision = matmul_precision(_Inputs(dtypes))
        if precision == "low":
            out.matmul_low_us += us
        elif precision == "fp32":
            out.matmul_fp32_us += us
            out.matmul_fp32_calls += 1
            call = OpCall(names.names[op], freeze(shapes), freeze(dtypes), freeze([literal(v) for v in concrete]))
            totals = out.fp32_matmuls.get(call)
            if totals is None and len(out.fp32_matmuls) < MAX_MATMUL_CALLS:
                totals = out.fp32_matmuls[call] = [0, 0.0, 0.0, 0]
            if totals is not None:
                totals[0] += 1
                totals[1] += us
                totals[3] += forward


@dataclass
class _Inputs:
    """An op's input types, read as sweep.matmul_precision reads a raw event's."""

    types: list

    def dtypes(self) -> list:
        return self.types


def _timeline(out: TraceSummary, events: _Events, names: _Names, tops: torch.Tensor, closed: tuple) -> dict:
    """A bar per top-level event of a step, in the category that took most of the self time under it (the
    first to close among those tied, as the sweep's dict keeps them); returns the bars' intervals by lane.
    ``closed``: the events in the steps in closing order, and every event's category and self time."""
    closing, category, self_us = closed
    top = tops[closing]
    bars = closing[top == closing]  # the bars themselves, in closing order
    if not len(bars):
        return {}
    slot = torch.full((len(tops),), -1, dtype=torch.long)
    slot[bars] = torch.arange(len(bars))
    under = top >= 0
    count = len(CATEGORIES)
    key = slot[top[under]] * count + category[closing[under]]
    sums = torch.zeros(len(bars) * count, dtype=torch.float64).scatter_add_(0, key, self_us[closing[under]])
    first = torch.full((len(bars) * count,), len(key)).scatter_reduce_(0, key, torch.arange(len(key)), "amin")
    sums = torch.where(first < len(key), sums, -torch.inf).view(len(bars), count)
    tied = sums == sums.max(dim=1, keepdim=True).values
    dominant = torch.where(tied, first.view(len(bars), count), len(key)).argmin(dim=1).tolist()
    intervals: dict[str, list] = {}
    starts, ends = events.start[bars].tolist(), events.end[bars].tolist()
    lane_of, name_of = events.thread[bars].tolist(), names.name_id[events.kind[bars]].tolist()
    lanes = events.lanes
    for start, end, lane, name, code in zip(starts, ends, lane_of, name_of, dominant):
        out.timeline.append(Span(lanes[lane], start, end - start, CATEGORIES[code], names.names[name]))
        intervals.setdefault(lanes[lane], []).append((start, end))
    return intervals


def _opened(out: TraceSummary, events: _Events, names: _Names, ctx: _Context) -> list[tuple[int, float, float]]:
    """What the sweep notes as it opens each op in the steps (sweep._op_opened): ops called from Python and
    the Python time between them, autograd's graph nodes, the optimizer's ops; and as it opens any event
    whose own phase takes over: backward's nodes, the optimizer's name.  Returns the gaps between Python ops
    (the index of the op before, its end, the next one's start)."""
    kind, phase, length = events.kind, ctx.phase, events.end - events.start
    op = names.op[kind] & (ctx.step >= 0)
    out.launching_ops += int((op & ~ctx.under_op & (phase != _CATEGORY[DATA]) & ~names.no_kernel[kind]).sum())
    backward_node = op & (phase == _CATEGORY[BACKWARD]) & names.backward_node[kind]
    sequence = torch.where((phase < 0) | backward_node, events.sequence, -1)
    python = op & (phase < 0) & ~ctx.under_op  # called straight from Python
    rows = python.nonzero().flatten()
    durations, nodes, syncs = length[rows].tolist(), sequence[rows].tolist(), names.sync[kind[rows]].tolist()
    out.python_ops += len(rows)
    out.python_op_us += durations
    out.python_op_nodes += nodes
    out.python_op_sync += syncs
    out.python_gap_us += [0.0] * len(rows)
    for us, node, sync in zip(durations, nodes, syncs):
        if sync:
            out.sync_calls += 1
            out.sync_us += us
        if node >= 0:
            out.graph_node_us[node] = out.graph_node_us.get(node, 0.0) + us
    out.graph_nodes.update(sequence[op & (phase < 0) & (sequence >= 0)].tolist())
    out.backward_nodes.update(sequence[backward_node & (sequence >= 0)].tolist())
    _optimizer(out, names, kind, op & (phase == _CATEGORY[OPTIMIZER]))
    if "aten::contiguous" in names.names:
        out.layout_copies += int((op & (names.name_id[kind] == names.names.index("aten::contiguous"))).sum())
    own = names.phase[kind]
    out.backward_events += int((ctx.took & (own == _CATEGORY[BACKWARD])).sum())
    for code in torch.unique(kind[ctx.took & (own == _CATEGORY[OPTIMIZER]) & ~names.op[kind]]).tolist():
        out.optimizer_names.add(events.kinds[code].name.split("#", 1)[1].split(".", 1)[0])
    return _python_gaps(events, python, own >= 0, ctx.step)


def _optimizer(out: TraceSummary, names: _Names, kind: torch.Tensor, optimizer_ops: torch.Tensor) -> None:
    out.optimizer_ops += int(optimizer_ops.sum())
    for i in torch.unique(names.name_id[kind[optimizer_ops]]).tolist():
        if "_fused_" in names.names[i]:
            out.optimizer_fused = True
        elif "_foreach_" in names.names[i]:
            out.optimizer_foreach = True


def _python_gaps(events: _Events, python: torch.Tensor, resets: torch.Tensor, step: torch.Tensor) -> list:
    """The Python time after each op called from Python until the next on its thread in the same step, where
    no event opening a phase came between (in visiting order, as the sweep's ``last_python`` sees them)."""
    seen = (python | resets).nonzero().flatten()
    before, after = seen[:-1], seen[1:]
    index = torch.cumsum(python.long(), 0) - 1  # each Python op's place in python_op_us
    gap = python[before] & python[after] & (events.thread[before] == events.thread[after]) \
        & (step[before] == step[after]) & (events.start[after] > events.end[before])
    before, after = before[gap], after[gap]
    return list(zip(index[before].tolist(), events.end[before].tolist(), events.start[after].tolist()))


@dataclass
class _SweepLike:
    """What summarizer.discount_waiting reads of a sweep."""

    bars: dict
    main_lane: str
    gaps: list
