"""The operator report's summary of a trace (a TraceSummary), computed over its columns (event_table.py) without a
Python step per host event.  A group of consecutive steps at a time (bounding what is made besides the columns):
runtime calls joined to their op's thread and the nesting from tree.py, what each event inherits from its
ancestors a depth at a time (summary_context.py), what runtime calls note (summary_runtime.py) and memory
records (summary_memory.py), every total as a masked sum (summary_totals.py), the main thread's waiting
(summary_waiting.py), then the device's events given to the ops that launched them (summary_device.py).
Groups begin at the steps ``group_starts`` picks: each event is in the group its start falls in, a kernel in its
launch's, and one begun outside the steps in each group it is open across; what later groups need (the steps so
far, the main thread, memory levels, op calls and kernels' first launches, the group before's device intervals
and other threads' work past its steps, the lowest runtime call's id) is carried from one to the next.

Times are µs since the trace's first event as float64 (the ns difference over 1000; an end, the start plus the
duration over 1000), and nesting and windows are decided on them.  The figures are the columns' own:
tests/profile/traces/recorded.py holds them to summaries recorded when an earlier per-event pass (removed
since) and this one agreed field by field.
"""

from __future__ import annotations


from array import array
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ..array_views import tensor_view
from ..event_kinds import ANNOTATION, DEVICE, MEMORY, OP, PYTHON, RUNTIME
from ..kineto import CPU_OP, STEP_PREFIX, USER_ANNOTATION
from ..summary import TraceSummary
from ..timeline import MAIN_LANE
from .summary_context import Events, context_of, names_of
from .summary_device import DeviceBusy, DeviceColumns, attribute, count_lost, device_reads, first_launches
from .summary_memory import MemoryColumns, memory_levels, memory_records
from .summary_runtime import relinked_threads, runtime_opened
from .summary_totals import Marks, closed_totals, opened_totals
from .summary_waiting import discount_waiting
from .table_codes import EventKind
from .event_table import EventTable
from .rank import step_windows
from .tree import event_tree

_SLICE = 1 << 18  # events worked on at once where a figure is made for every event (a few MB a figure)


@dataclass
class _Table:
    """Every timed event in file order (ns; codes as the columns give them), the whole-trace marker last
    where there are no steps."""

    start: torch.Tensor
    end: torch.Tensor
    kind: torch.Tensor
    thread: torch.Tensor
    sequence: torch.Tensor
    inputs: torch.Tensor
    external: torch.Tensor
    linked_rows: torch.Tensor  # the rows of runtime calls and device events (ascending), and their CUPTI ids
    correlation: torch.Tensor
    kinds: list[EventKind]
    tids: list
    first: int
    memory: MemoryColumns


@dataclass
class _Carried:
    """What one group leaves the next: the steps so far, the main thread, other threads' work past them."""

    windows: list[tuple[float, float]] = field(default_factory=list)
    level: dict = field(default_factory=lambda: defaultdict(int))  # device -> bytes allocated so far
    base: dict = field(default_factory=dict)  # device -> its level at the first step's start
    main: object = None  # the first step's thread (its tid: an int or a string, never None)
    others_after: list = field(default_factory=list)
    op_calls: Counter = field(default_factory=Counter)  # op name -> calls so far (a first call may set up)
    first_kernels: dict = field(default_factory=dict)  # kernel name id -> the CUPTI id of its first launch
    busy_before: DeviceBusy = field(default_factory=DeviceBusy)  # the group before's device intervals
    first_launch: int | None = None  # the lowest runtime call's CUPTI id so far (lost events)


def summarize_table(columns: EventTable, limit: int, flops: bool = False,
                    shapes: bool | None = None) -> tuple[TraceSummary, int, bool]:
    """The summary of the table's events over all its steps, read in groups of about ``limit`` rows
    (``group_starts``), its first event's start (ns), and whether ops' time is kept by their shapes: as asked
    (``shapes``), else where an op had shapes recorded; ``flops``: count ops' FLOPs and tensor bytes."""
    out, table = TraceSummary(), _table(columns)
    if shapes is None:
        shaped = torch.tensor([bool(shapes) for shapes, _, _ in columns.input_lists], dtype=torch.bool)
        is_op = torch.tensor([k.cat == CPU_OP for k in table.kinds], dtype=torch.bool)
        shapes = bool(shaped[table.inputs[is_op[table.kind.long()]].long()].any())
    names, carried = names_of(table.kinds), _Carried()
    steps = step_windows(columns)
    cuts = group_starts(steps, len(columns.start), limit)
    if len(cuts) > 1:  # per kernel and per Python op: 8 bytes, not a float object and its pointer
        out.kernel_us, out.launch_delay_us = array("d"), array("d")
        out.python_op_us, out.python_gap_us = array("d"), array("d")
        out.python_op_nodes, out.python_op_sync = array("q"), array("b")
    count = max(len(cuts), 1)
    for index, rows in enumerate(_groups(table, steps, cuts)):  # (each group's bars bounded as they are added)
        _add(out, _events(table, rows, names, _Kept(columns.input_lists, shapes, len(cuts) > 1, flops)), names,
             carried, table.memory, index == count - 1)
    out.event_count = len(table.start)
    return out, table.first, shapes


def group_starts(steps: dict[int, tuple[int, int]], rows: int, limit: int) -> list[int]:
    """The start (ns) of each group's first step: about ``limit`` of the table's ``rows`` a group, as the steps
    average them; one group ([]) for a table within the limit or without steps."""
    if rows <= limit or not steps:
        return []
    starts = sorted(start for start, _ in steps.values())
    per_group = max(1, int(limit / (rows / len(starts))))
    return starts[::per_group] if per_group < len(starts) else []


def _table(columns: EventTable) -> _Table:
    start = tensor_view(columns.start, torch.long)
    memory = MemoryColumns(tensor_view(columns.memory_rows, torch.long),
                           tensor_view(columns.memory_bytes, torch.long),
                           tensor_view(columns.memory_device, torch.int32), columns.devices)
    table = _Table(start, tensor_view(columns.end, torch.long), tensor_view(columns.kind, torch.int32),
                   tensor_view(columns.thread, torch.int32), tensor_view(columns.sequence, torch.long),
                   tensor_view(columns.inputs, torch.int32), tensor_view(columns.external, torch.long),
                   tensor_view(columns.linked_rows, torch.long), tensor_view(columns.correlation, torch.long),
                   list(columns.kinds), list(columns.threads), int(start.min()), memory)
    if not columns.steps:
        _add_whole_trace_marker(table)
    return table


def _add_whole_trace_marker(table: _Table) -> None:
    """A ProfilerStep#0 marker over the trace's span, for a trace without steps (read as one step): from its
    first event's start to its latest end, on the thread that ran most ops (of those tied, the first seen; tid 0
    with no ops)."""
    is_op = torch.tensor([k.cat == CPU_OP for k in table.kinds], dtype=torch.bool)[table.kind.long()]
    ops = table.thread[is_op].long()
    tid = 0
    if len(ops):
        counts = torch.bincount(ops, minlength=len(table.tids))
        tied = (counts == counts.max()).nonzero().flatten().tolist()
        first = [int((ops == code).nonzero()[0]) for code in tied]
        tid = table.tids[tied[first.index(min(first))]]
    if tid not in table.tids:
        table.tids.append(tid)
    table.kinds.append(EventKind(f"{STEP_PREFIX}0", USER_ANNOTATION, ANNOTATION))

    def grown(column: torch.Tensor, value) -> torch.Tensor:
        return torch.cat([column, torch.tensor([value], dtype=column.dtype)])

    table.start, table.end = grown(table.start, table.first), grown(table.end, int(table.end.max()))
    table.kind, table.thread = grown(table.kind, len(table.kinds) - 1), grown(table.thread, table.tids.index(tid))
    table.sequence, table.inputs = grown(table.sequence, -1), grown(table.inputs, 0)
    table.external = grown(table.external, 0)


def _light(table: _Table, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's light kind (event_kinds.event_kind's; -1 for a row the summary sets aside), a byte each: of
    ``rows``, or of every row."""
    kinds = torch.tensor([-1 if k.kind is None else k.kind for k in table.kinds], dtype=torch.int8)
    return kinds[table.kind if rows is None else table.kind[rows]]


def _correlation(table: _Table, rows: torch.Tensor) -> torch.Tensor:
    """CUPTI's correlation id of each of ``rows`` (0 for an event that is neither a runtime call nor on the
    device)."""
    if not len(table.linked_rows):
        return torch.zeros(len(rows), dtype=torch.long)
    slot = torch.searchsorted(table.linked_rows, rows).clamp(max=len(table.linked_rows) - 1)
    return torch.where(table.linked_rows[slot] == rows, table.correlation[slot], 0)


def _groups(table: _Table, steps: dict[int, tuple[int, int]], cuts: list[int]) -> Iterator[torch.Tensor]:
    """Each group's events (indices, in file order): each in the group its start falls in (the last to begin at
    or before it; the first for an earlier one), a kernel (or copy) in its launch's group, and a host event begun
    outside the steps in each later group it is open across the start of too (a Python frame around the training
    loop: what runs under it there keeps its context).  Found a slice of the columns at a time: what is made per
    event is its group and its place, 12 bytes.  ``cuts``: each group's first step's start (ns)."""
    if len(cuts) < 2:
        yield torch.arange(len(table.start))
        return
    cuts = torch.tensor(cuts, dtype=torch.long)
    group = torch.empty(len(table.start), dtype=torch.int32)
    for at in range(0, len(table.start), _SLICE):
        group[at:at + _SLICE] = (torch.searchsorted(cuts, table.start[at:at + _SLICE], right=True) - 1).clamp(min=0)
    on_device = _light(table) == DEVICE
    spanning, last = _spanning(table, steps, cuts, group, on_device)
    _launched_in(table, group, on_device[table.linked_rows])
    del on_device
    first = group[spanning]
    for g in range(len(cuts)):  # a group's rows found when it is read: no index of all rows held besides
        own = (group == g).nonzero().flatten()
        copied = spanning[(first < g) & (last >= g)]
        yield torch.cat([own, copied]).sort().values if len(copied) else own


def _launched_in(table: _Table, group: torch.Tensor, device: torch.Tensor) -> None:
    """Move each kernel (or copy) to its launch's group (``device``: which linked rows are on the device): the
    group whose range of runtime calls' correlation ids (its lowest to its highest; CUPTI numbers calls in order)
    holds its id (of the ranges beginning at or below it, the one beginning last), unless that group is a later
    one than its own by time (a kernel starts after its launch); else it stays.  A slice of the rows at a time."""
    linked, correlation = table.linked_rows, table.correlation
    count = int(group.max()) + 1 if len(group) else 0
    low = torch.full((count,), torch.iinfo(torch.long).max)
    high = torch.full((count,), torch.iinfo(torch.long).min)
    for at in range(0, len(linked), _SLICE):
        ids, launch = correlation[at:at + _SLICE], ~device[at:at + _SLICE]
        launch &= ids != 0
        by = group[linked[at:at + _SLICE][launch]].long()
        low.scatter_reduce_(0, by, ids[launch], "amin")
        high.scatter_reduce_(0, by, ids[launch], "amax")
    ranges = sorted((lo, hi, g) for g, (lo, hi) in enumerate(zip(low.tolist(), high.tolist())) if lo <= hi)
    if not ranges:
        return
    lows, highs, groups = (torch.tensor([r[i] for r in ranges], dtype=torch.long) for i in range(3))
    for at in range(0, len(linked), _SLICE):
        ids, kernel = correlation[at:at + _SLICE], device[at:at + _SLICE] & (correlation[at:at + _SLICE] != 0)
        rows, ids = linked[at:at + _SLICE][kernel], ids[kernel]
        own = group[rows].long()
        i = torch.searchsorted(lows, ids, right=True) - 1
        found = i.clamp(min=0)
        launched = (i >= 0) & (ids <= highs[found]) & (groups[found] <= own)
        group[rows] = torch.where(launched, groups[found], own).to(group.dtype)


def _spanning(table: _Table, steps: dict[int, tuple[int, int]], cuts: torch.Tensor, group: torch.Tensor,
              on_device: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The host events begun outside the steps and open across a later group's start (``group``: the one each
    begins in; ``on_device``: which rows are device events, never copied): their indices, and the last group
    each is open in."""
    windows = sorted(steps.values())
    step_start = torch.tensor([a for a, _ in windows], dtype=torch.long)
    step_end = torch.tensor([b for _, b in windows], dtype=torch.long)
    found = []
    for at in range(0, len(table.start), _SLICE):
        start, end, mine = table.start[at:at + _SLICE], table.end[at:at + _SLICE], group[at:at + _SLICE].long()
        i = torch.searchsorted(step_start, start, right=True) - 1
        in_step = (i >= 0) & (start <= step_end[i.clamp(min=0)])
        later = cuts[(mine + 1).clamp(max=len(cuts) - 1)]
        spans = (end > start) & (mine + 1 < len(cuts)) & (end > later) & ~in_step & ~on_device[at:at + _SLICE]
        found.append(spans.nonzero().flatten() + at)
    spanning = torch.cat(found)
    return spanning, (torch.searchsorted(cuts, table.end[spanning] - 1, right=True) - 1).clamp(min=0)


@dataclass
class _Kept:
    """What every group's events keep: the ops' input lists, whether shapes were recorded, whether there are
    several groups, and whether FLOPs are counted."""

    input_lists: list
    shapes: bool
    grouped: bool
    flops: bool


@dataclass
class _Group:
    """A group's host events and device events."""

    events: Events
    device: DeviceColumns


def _events(table: _Table, rows: torch.Tensor, names, kept: _Kept) -> _Group:
    """A group's host events (ops, user ranges, Python frames, runtime calls, memory records) in visiting order
    (tree.py: thread by thread in the order threads first appear in the group, each thread's by start, longer
    first, then file order), their times µs since the trace's first event, and its device events."""
    light = _light(table, rows)
    host = rows[(light == OP) | (light == ANNOTATION) | (light == PYTHON) | (light == MEMORY) | (light == RUNTIME)]
    device = _device(table, rows[light == DEVICE], names, kept.grouped)
    start = (table.start[host] - table.first).double() / 1000.0
    end = start + (table.end[host] - table.start[host]).double() / 1000.0
    external, correlation = table.external[host], _correlation(table, host)
    thread = table.thread[host].long()
    if len(device):  # for linking kernels: runtime calls joined to their op's thread (CUPTI reports OS thread ids)
        thread = relinked_threads(table.kind[host].long(), thread, external, names, table.tids)
    lane, codes = _first_seen_order(thread)
    tree = event_tree(lane, start, end)
    at, order = host[tree.order], tree.order
    reads = device_reads(device, names)
    device_read = names.runtime[table.kind[at].long()] & torch.isin(correlation[order], reads)
    events = Events(table.kind[at].long(), start[order], end[order], lane[order], table.sequence[at],
                    table.inputs[at].long(), external[order], correlation[order], device_read, at, tree, table.kinds,
                    [table.tids[code] for code in codes.tolist()], [], kept.input_lists, kept.shapes, kept.flops)
    return _Group(events, device)


def _device(table: _Table, rows: torch.Tensor, names, grouped: bool) -> DeviceColumns:
    """A group's device events in file order; where there are several groups, those with a CUPTI id after those
    without (each part in file order)."""
    correlation = _correlation(table, rows)
    if grouped:
        order = torch.argsort((correlation != 0).long(), stable=True)
        rows, correlation = rows[order], correlation[order]
    start = (table.start[rows] - table.first).double() / 1000.0
    end = start + (table.end[rows] - table.start[rows]).double() / 1000.0
    tids = table.tids
    return DeviceColumns(start, end, names.name_id[table.kind[rows].long()],
                         [tids[t] for t in table.thread[rows].tolist()], table.external[rows], correlation)


def _first_seen_order(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each code renumbered in the order codes first appear, and the codes in that order."""
    unique, inverse = torch.unique(codes, return_inverse=True)
    first = torch.full((len(unique),), len(codes)).scatter_reduce_(0, inverse, torch.arange(len(codes)), "amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    return rank[inverse], unique[order]


def _add(out: TraceSummary, group: _Group, names, carried: _Carried, memory: MemoryColumns, last: bool) -> None:
    """One group's events summarised into ``out``, added to what the groups before added and carrying what the
    next needs (``last``: no step follows): its steps' windows (markers by start, ties in file order), each host
    event's context, runtime calls, memory records, the totals of closed and opened events, the main thread's
    waiting, memory levels, then the device's events and those the profiler lost."""
    events, device = group.events, group.device
    step_rows = names.step[events.kind].nonzero().flatten()
    step_rows = step_rows[torch.argsort(events.tree.order[step_rows], stable=True)]  # the file's order, then
    step_rows = step_rows[torch.argsort(events.start[step_rows], stable=True)]       # by start
    windows = list(zip(events.start[step_rows].tolist(), events.end[step_rows].tolist()))
    before = len(carried.windows)
    out.step_us += [end - start for start, end in windows]
    out.step_start_us += [start for start, _ in windows]
    carried.windows += windows
    if carried.main is None and len(step_rows):
        carried.main = events.tids[int(events.thread[step_rows[0]])]
    events.lanes = [MAIN_LANE if tid == carried.main else f"CPU thread {tid}" for tid in events.tids]
    context = context_of(events, names, step_rows, carried.windows, before)
    first = first_launches(device, carried.first_kernels)
    links, one_time = runtime_opened(out, events, names, context, carried.op_calls, first)
    records, allocations = memory_records(out, events, names, memory, carried.windows)
    bars = closed_totals(out, events, names, context, Marks(allocations, one_time, links if len(device) else None))
    gaps = opened_totals(out, events, names, context)
    carried.others_after = discount_waiting(out, bars, gaps, carried.windows[before:], carried.others_after)
    memory_levels(out, records, carried.windows, carried.level, carried.base, last)
    carried.busy_before = attribute(out, device, links, names, carried.windows, carried.busy_before)
    carried.first_launch = count_lost(out, device, links, carried.first_launch)
