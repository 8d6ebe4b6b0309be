"""Runtime calls in the table summary (table_summary.py): a group's runtime calls joined to their op's thread
(CUPTI reports OS thread ids), and what each notes as it opens, from its context: when a launch returned,
whether it was made in a step, copies to the host and explicit syncs, one-time costs, launches no op
encloses."""

from __future__ import annotations

from collections import Counter


import torch

from ..categories import DATA
from ..kineto import START_UP_MIN_US, one_time_cost
from .summary_context import CATEGORY, Context, Events, Names, category_of
from .summary_device import ColumnLinks, Keyed
from .summary_totals import ONE_TIME


def relinked_threads(kind: torch.Tensor, thread: torch.Tensor, external: torch.Tensor, names: Names,
                     tids: list) -> torch.Tensor:
    """Each event's thread code with runtime calls joined to the thread of their op (by its id; the last op of
    an id in the file's order; one on a thread whose tid is 0 or '' leaves its calls to the next rule), else to
    the thread their OS thread was seen to be (that of the op of the last call on it that has one), else left
    as they are.  ``kind``, ``thread``, ``external``: the group's host events in the file's order."""
    is_op, runtime = names.op[kind], names.runtime[kind]
    if not bool(runtime.any()):
        return thread
    corr_tid = dict(zip(external[is_op].tolist(), thread[is_op].tolist()))
    rows = runtime.nonzero().flatten()
    calls, own = external[rows].tolist(), thread[rows].tolist()
    os_thread = {tid: corr_tid[corr] for corr, tid in zip(calls, own) if corr in corr_tid}
    falsy = {code for code, tid in enumerate(tids) if not tid}
    linked = [tid if tid is not None and tid not in falsy else os_thread.get(mine, mine)
              for tid, mine in ((corr_tid.get(corr), mine) for corr, mine in zip(calls, own))]
    thread = thread.clone()
    thread[rows] = torch.tensor(linked, dtype=thread.dtype)
    return thread


def runtime_opened(out, events: Events, names: Names, ctx: Context, op_calls: Counter,
                   first: torch.Tensor) -> tuple[ColumnLinks, torch.Tensor]:
    """What each runtime call notes as it opens, and the group's data loading in the steps (the events opening
    it where no phase was open); returns the links for the device's events and each event's one-time cost (a
    code into ONE_TIME, -1 for none).  ``op_calls``: op calls so far, by name (this group's added); ``first``: the
    CUPTI ids of this group's first launches of a kernel."""
    kind, links = events.kind, ColumnLinks()
    data = ctx.took & (names.phase[kind] == CATEGORY[DATA]) & (ctx.step >= 0)
    links.data = torch.stack([events.start[data], events.end[data]], dim=1)
    one_time = torch.full((len(kind),), -1, dtype=torch.long)
    rows = names.runtime[kind].nonzero().flatten()
    if len(rows):
        _links(links, events, names, ctx, rows)
        _syncs(out, events, names, ctx, rows)
        _one_time(events, names, rows, op_calls, set(first.tolist()), one_time)
    ops = names.name_id[kind[names.op[kind]]]
    op_calls.update({names.names[i]: count for i, count in enumerate(torch.bincount(ops).tolist()) if count})
    return links, one_time


def _links(links: ColumnLinks, events: Events, names: Names, ctx: Context, rows: torch.Tensor) -> None:
    """When each launch returned, whether each call was made in a step, and each launch no op encloses in a
    step (its innermost user range and category), by CUPTI's correlation id, the last visited of an id kept."""
    corr, step, kind = events.correlation[rows], ctx.step[rows], events.kind[rows]
    launch = names.launch[kind]
    links.launch_end = Keyed.last_of(corr[launch], events.end[rows][launch])
    has = corr != 0
    links.in_step = Keyed.last_of(corr[has], step[has] >= 0)
    outside = has & (step >= 0) & ~ctx.under_op[rows]
    if not bool(outside.any()):
        return
    at = rows[outside]
    links.launches = Keyed.last_of(corr[outside], ctx.user_range[at], category_of(names, events.kind, ctx, at))


def _syncs(out, events: Events, names: Names, ctx: Context, rows: torch.Tensor) -> None:
    """Copies to the host in the steps (each waits for the device) and explicit syncs
    (torch.cuda.synchronize()), where no sync encloses them and no phase claims them."""
    parent = events.tree.parent[rows]
    inherited = torch.where(parent >= 0, ctx.in_sync[parent.clamp(min=0)], False)
    counted = (ctx.step[rows] >= 0) & (ctx.phase[rows] < 0)
    length = (events.end - events.start)[rows]
    read = counted & events.device_read[rows] & ~inherited
    out.device_read_calls += int(read.sum())
    out.device_read_us += float(length[read].sum())
    sync = counted & names.sync_runtime[events.kind[rows]] & ~ctx.in_sync[rows]
    out.sync_runtime_calls += int(sync.sum())
    out.sync_runtime_us += float(length[sync].sum())


def _one_time(events: Events, names: Names, rows: torch.Tensor, op_calls: Counter, first: set,
              one_time: torch.Tensor) -> None:
    """Mark the slow runtime calls that are a one-time cost (kineto.one_time_cost): an op's first call in the
    trace setting up, a kernel's first launch loading it (``first``: those launches' ids), creating the context."""
    length = (events.end - events.start)[rows]
    slow = rows[length >= START_UP_MIN_US]
    if not len(slow):
        return
    kind, parent = events.kind, events.tree.parent
    op_name = torch.where(names.op[kind], names.name_id[kind], -1)
    for i in slow.tolist():
        p = int(parent[i])
        first_call = False
        if p >= 0 and bool(names.op[kind[p]]):
            name = int(op_name[p])  # the op's calls opened so far, this one's and any under it included
            first_call = op_calls[names.names[name]] + int((op_name[:i + 1] == name).sum()) == 1
        first_launch = bool(names.launch[kind[i]]) and int(events.correlation[i]) in first
        cost = one_time_cost(names.names[int(names.name_id[kind[i]])], float(events.end[i] - events.start[i]),
                             first_call, first_launch)
        if cost is not None:
            one_time[i] = ONE_TIME.index(cost)
