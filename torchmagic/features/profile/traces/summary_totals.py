"""The table summary's totals (table_summary.py): what each event in the steps adds as it closes (self time by
category, the operator table, shapes and matmuls, the timeline's bars) and what it notes as it opens (ops called
from Python and the time between them, autograd's graph nodes, the optimizer's ops), each a masked sum over a
group's events, added to what the groups before added.  Events close as tree.py nests them, innermost first; a
dict's rows are made in the order of their codes (names as first read), which no view shows (each sorts, ties by
name)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....core.measure.low_precision import OpCall, freeze
from ..categories import BACKWARD, CATEGORIES, COPIES, DATA, FORWARD, LOW_PRECISION_DTYPES, OPTIMIZER, OTHER, START_UP
from ..kineto import CUDA_CONTEXT, FIRST_COMPILE, LAZY_LOADING, LIBRARY_SET_UP
from ..summary import OpStats, TraceSummary
from ..timeline import Bars, add_bounded
from ..traffic import MATMUL_OPS, off_tensor_core_grain
from .summary_context import CATEGORY, Context, Events, Names, category_of
from .summary_device import FP32, LOW, ColumnLinks, Keyed
from .summary_flops import flop_links, flop_totals
from .summary_memory import OpAllocations
from .fields import literal

MAX_MATMUL_CALLS = 4096  # distinct fp32 matmul calls kept (shapes that vary every step would grow it unbounded)
ONE_TIME = (FIRST_COMPILE, CUDA_CONTEXT, LIBRARY_SET_UP, LAZY_LOADING)  # the one-time costs' codes


@dataclass
class Marks:
    """What a group's earlier passes marked for its closed totals."""

    allocations: OpAllocations  # the bytes memory records gave the ops they were visited under
    one_time: torch.Tensor  # each event's one-time cost (a runtime call's: a code into ONE_TIME), -1 for none
    links: ColumnLinks | None  # the links to the device's events to fill (None where the group has none)


@dataclass
class _Closed:
    """Events in the steps in closing order (``rows``), with every event's category and self time."""

    rows: torch.Tensor
    category: torch.Tensor
    self_us: torch.Tensor

    def only(self, chosen: torch.Tensor) -> _Closed:
        return _Closed(self.rows[chosen], self.category, self.self_us)


def closed_totals(out: TraceSummary, events: Events, names: Names, ctx: Context, marks: Marks) -> dict:
    """What each event in the steps adds as it closes: its self time (its length less its children's, not below
    0) by category, the operator table, the timeline's bars (each in its dominant category); returns the bars'
    intervals by lane."""
    one_time, links = marks.one_time, marks.links
    tree, kind = events.tree, events.kind
    length = events.end - events.start
    has = tree.parent >= 0
    self_us = (length - torch.zeros_like(length).scatter_add_(0, tree.parent[has], length[has])).clamp(min=0.0)
    is_step = (ctx.step >= 0) & (ctx.top < 0)  # only a marker has a step but no bar
    category = category_of(names, kind, ctx, torch.arange(len(kind)))
    category = torch.where(one_time >= 0, CATEGORY[START_UP], torch.where(is_step, CATEGORY[OTHER], category))
    closing = tree.close_order()
    # outside the steps nothing is counted; a memory record is visited, never opened
    closing = closing[(ctx.step[closing] >= 0) & ~names.memory[kind[closing]]]
    totals = torch.zeros(len(CATEGORIES), dtype=torch.float64).scatter_add_(0, category[closing], self_us[closing])
    for code, total in enumerate(totals.tolist()):
        out.category_us[CATEGORIES[code]] += total
    _one_time(out, torch.where(one_time >= 0, one_time, torch.where(category == CATEGORY[START_UP], 0, -1))[closing],
              self_us[closing])
    rows = closing[~is_step[closing] & ~names.python[kind[closing]]]  # Python frames are in no op's row
    _operator_table(out, names, kind[rows], self_us[rows], length[rows], marks.allocations)
    ops = _Closed(rows, category, self_us).only(names.op[kind[rows]])
    precision = _inputs(out, events, names, ops, links)
    if links is not None:
        _op_links(links, events, names, ops, precision)
    if events.flops:
        flop_totals(out, events, names, ctx, ops.rows)
        if links is not None:
            flop_links(links, events, names, ctx)
    for phase, field in ((OPTIMIZER, "optimizer_us"), (DATA, "data_us"), (COPIES, "copy_us")):
        setattr(out, field, getattr(out, field) + float(self_us[rows][category[rows] == CATEGORY[phase]].sum()))
    return _timeline(out, events, names, ctx.top, _Closed(closing, category, self_us))


def _one_time(out: TraceSummary, kind: torch.Tensor, self_us: torch.Tensor) -> None:
    """Each one-time cost's self time (``kind``: codes into ONE_TIME, -1 for none)."""
    marked = kind >= 0
    if not bool(marked.any()):
        return
    kind, self_us = kind[marked], self_us[marked]
    sums = torch.zeros(len(ONE_TIME), dtype=torch.float64).scatter_add_(0, kind, self_us).tolist()
    for code in torch.unique(kind).tolist():
        out.one_time_us[ONE_TIME[code]] = out.one_time_us.get(ONE_TIME[code], 0.0) + sums[code]


def _op_links(links: ColumnLinks, events: Events, names: Names, ops: _Closed, precision: dict) -> None:
    """Each op's name, category and matmul precision by its id, for its kernels (of ops sharing an id, the last
    to close is kept)."""
    rows, category = ops.rows, ops.category[ops.rows]
    codes = torch.zeros(len(rows), dtype=torch.long)
    for place, kept in precision.items():
        codes[place] = LOW if kept == "low" else FP32 if kept == "fp32" else 0
    external = events.external[rows]
    linked = external != 0
    links.ops = Keyed.last_of(external[linked], names.name_id[events.kind[rows]][linked], category[linked],
                              codes[linked])


def _operator_table(out: TraceSummary, names: Names, kind: torch.Tensor, self_us: torch.Tensor, length: torch.Tensor,
                    allocations: OpAllocations) -> None:
    """Calls, self and total time per name of the closed rows (their ``kind``, self and total times), and the
    bytes allocated under each op."""
    name = names.name_id[kind]
    count = len(names.names)
    calls = torch.bincount(name, minlength=count)
    own = torch.zeros(count, dtype=torch.float64).scatter_add_(0, name, self_us).tolist()
    total = torch.zeros(count, dtype=torch.float64).scatter_add_(0, name, length).tolist()
    given = torch.zeros(count, dtype=torch.long).scatter_add_(0, allocations.name, allocations.nbytes)
    rows = ((calls > 0) | (given != 0)).nonzero().flatten().tolist()
    calls, given = calls.tolist(), given.tolist()
    for i in rows:
        stats = out.ops.get(names.names[i])
        if stats is None:
            stats = out.ops[names.names[i]] = OpStats(names.names[i])
        stats.calls += calls[i]
        stats.self_cpu_us += own[i]
        stats.total_cpu_us += total[i]
        stats.allocated_bytes += given[i]


def _inputs(out: TraceSummary, events: Events, names: Names, ops: _Closed, links: ColumnLinks | None) -> dict:
    """What ops' inputs decide, over the ops in the steps in closing order: each op's self time by its shapes
    (where shapes were recorded), and matmuls' time by precision, each distinct fp32 call kept for the amp rule
    (at most MAX_MATMUL_CALLS of them, the first to close), with ``links`` (where kernels are linked) a 16-bit
    matmul off the tensor cores' grain and each kept fp32 call by the op's id.  Returns the matmuls' precisions
    ("low" or "fp32") by their place in ``ops``."""
    category, self_us, ops = ops.category[ops.rows], ops.self_us[ops.rows], ops.rows
    name, inputs = names.name_id[events.kind[ops]], events.inputs[ops]
    if events.shapes:
        count = len(events.input_lists)
        unique, inverse = torch.unique(name * count + inputs, return_inverse=True)
        sums = torch.zeros(len(unique), dtype=torch.float64).scatter_add_(0, inverse, self_us).tolist()
        for i in range(len(unique)):
            op, code = divmod(int(unique[i]), count)
            out.ops[names.names[op]].shapes[shape_text(events.input_lists[code][0])] += sums[i]
    matmul = torch.tensor([n in MATMUL_OPS for n in names.names], dtype=torch.bool)[name]
    places = matmul.nonzero().flatten().tolist()
    external = events.external[ops[matmul]].tolist() if links is not None else [0] * len(places)
    precisions = {}
    for place, op, code, forward, us, corr in zip(places, name[matmul].tolist(), inputs[matmul].tolist(),
                                                  (category[matmul] == CATEGORY[FORWARD]).tolist(),
                                                  self_us[matmul].tolist(), external):
        shapes, dtypes, concrete = events.input_lists[code]
        precision = precisions[place] = matmul_precision(dtypes)
        if precision == "low":
            out.matmul_low_us += us
            shape = off_tensor_core_grain(names.names[op], shapes) if corr else None
            if shape is not None:
                links.misaligned[corr] = shape
        elif precision == "fp32":
            out.matmul_fp32_us += us
            out.matmul_fp32_calls += 1
            call = OpCall(names.names[op], freeze(shapes), freeze(dtypes), freeze([literal(v) for v in concrete]))
            if count_fp32_call(out, call, us, forward) is not None and corr:
                links.fp32_calls[corr] = call
    return precisions


def _timeline(out: TraceSummary, events: Events, names: Names, tops: torch.Tensor, closed: _Closed) -> dict:
    """A bar per top-level event of a step, in the category that took most of the self time under it (of
    categories tied, the one whose first event under the bar closed first), added to the timeline and bounded;
    returns the bars' intervals by lane (a tensor of (start, end) rows each, in closing order)."""
    closing, category, self_us = closed.rows, closed.category, closed.self_us
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
    dominant = torch.where(tied, first.view(len(bars), count), len(key)).argmin(dim=1)
    start, end, lane = events.start[bars], events.end[bars], events.thread[bars].long()
    add_bounded(out, Bars(events.lanes, lane, start, end - start, CATEGORIES, dominant, names.names,
                          names.name_id[events.kind[bars]].long()))
    spans = torch.stack([start, end], dim=1)
    return {events.lanes[code]: spans[lane == code] for code in torch.unique(lane).tolist()}


def opened_totals(out: TraceSummary, events: Events, names: Names, ctx: Context) -> list[tuple[int, float, float]]:
    """What each op in the steps notes as it opens, from its context: ops called from Python and the Python
    time between them, autograd's graph nodes, the optimizer's ops; and what any event whose own phase takes
    over notes: backward's ranges counted, the optimizer's name.  Returns the gaps between Python ops (the
    index of the op before, its end, the next one's start)."""
    kind, phase, length = events.kind, ctx.phase, events.end - events.start
    op = names.op[kind] & (ctx.step >= 0)
    out.launching_ops += int((op & ~ctx.under_op & (phase != CATEGORY[DATA]) & ~names.no_kernel[kind]).sum())
    backward_node = op & (phase == CATEGORY[BACKWARD]) & names.backward_node[kind]
    sequence = torch.where((phase < 0) | backward_node, events.sequence, -1)
    python = op & (phase < 0) & ~ctx.under_op  # called straight from Python
    rows, offset = python.nonzero().flatten(), len(out.python_op_us)
    durations, nodes, syncs = length[rows].tolist(), sequence[rows].tolist(), names.sync[kind[rows]].tolist()
    out.python_ops += len(rows)
    out.python_op_us.extend(durations)
    out.python_op_nodes.extend(nodes)
    out.python_op_sync.extend(syncs)
    out.python_gap_us.extend([0.0] * len(rows))
    frames, libraries = ctx.frame[rows].tolist(), ctx.library[rows].tolist()
    for us, node, sync, frame, library in zip(durations, nodes, syncs, frames, libraries):
        if frame >= 0:
            out.hot_lines[names.names[frame]] += us
        if library >= 0:
            out.python_ops_in_library[names.names[library]] += 1
        if sync:
            out.sync_calls += 1
            out.sync_us += us
            if library >= 0:
                out.syncs_in_library[names.names[library]] += 1
        if node >= 0:
            out.graph_node_us[node] = out.graph_node_us.get(node, 0.0) + us
    out.graph_nodes.update(sequence[op & (phase < 0) & (sequence >= 0)].tolist())
    out.backward_nodes.update(sequence[backward_node & (sequence >= 0)].tolist())
    _optimizer(out, names, kind, op & (phase == CATEGORY[OPTIMIZER]))
    if "aten::contiguous" in names.names:
        out.layout_copies += int((op & (names.name_id[kind] == names.names.index("aten::contiguous"))).sum())
    own = names.phase[kind]
    out.backward_events += int((ctx.took & (own == CATEGORY[BACKWARD])).sum())
    for code in torch.unique(kind[ctx.took & (own == CATEGORY[OPTIMIZER]) & names.annotation[kind]]).tolist():
        out.optimizer_names.add(events.kinds[code].name.split("#", 1)[1].split(".", 1)[0])
    return _python_gaps(events, python, own >= 0, ctx.step, offset)


def _optimizer(out: TraceSummary, names: Names, kind: torch.Tensor, optimizer_ops: torch.Tensor) -> None:
    """The optimizer's ops in the steps, and whether any was fused (one kernel) or multi-tensor (foreach)."""
    out.optimizer_ops += int(optimizer_ops.sum())
    for i in torch.unique(names.name_id[kind[optimizer_ops]]).tolist():
        if "_fused_" in names.names[i]:
            out.optimizer_fused = True
        elif "_foreach_" in names.names[i]:
            out.optimizer_foreach = True


def _python_gaps(events: Events, python: torch.Tensor, resets: torch.Tensor, step: torch.Tensor, offset: int) -> list:
    """The Python time after each op called from Python until the next one visited, where that is on the same
    thread in the same step and starts after it ends, and no event whose name opens a phase was visited between
    (the time until then is that phase's, not Python's)."""
    seen = (python | resets).nonzero().flatten()
    before, after = seen[:-1], seen[1:]
    index = torch.cumsum(python.long(), 0) + (offset - 1)  # each Python op's place in python_op_us
    gap = python[before] & python[after] & (events.thread[before] == events.thread[after]) \
        & (step[before] == step[after]) & (events.start[after] > events.end[before])
    before, after = before[gap], after[gap]
    return list(zip(index[before].tolist(), events.end[before].tolist(), events.start[after].tolist()))


def matmul_precision(dtypes: list) -> str | None:
    """A matmul's or convolution's precision by its first input's type: "low" (16 bits), "fp32", or None."""
    if not dtypes:
        return None
    if dtypes[0] in LOW_PRECISION_DTYPES:
        return "low"
    return "fp32" if dtypes[0] == "float" else None


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


def shape_text(shapes) -> str:
    return ", ".join(f"[{', '.join(map(str, s))}]" if isinstance(s, list) else str(s) for s in shapes if s != [])
