"""What each host event of a group of steps is, as the table summary (table_summary.py) reads it: its name's
meaning (``Names``), and what it inherits from the events around it when it is opened, in visiting order
(``Context``), worked out a depth at a time from the roots down."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..categories import (CATEGORIES, COPIES, COPY_OPS, FORWARD, NO_KERNEL_OPS, OTHER, START_UP, SYNC_OPS, SYNC_RUNTIME,
                          SYNCS, phase_of)
from ..event_kinds import ANNOTATION, DEVICE, MEMORY, OP, PYTHON, RUNTIME
from ..flops import counts_flops
from ..frames import is_library_frame, is_user_frame
from ..kineto import LAUNCH_CALLS, STEP_PREFIX, is_backward_node, is_copy_to_host, is_pageable_upload
from .table_codes import EventKind
from .tree import EventTree

CATEGORY = {category: code for code, category in enumerate(CATEGORIES)}


@dataclass
class Events:
    """A group's host events in visiting order (tree.py): thread by thread, in the order threads first appear
    in the group; each thread's by start, then longer first, then file order."""

    kind: torch.Tensor     # code into ``names``' table of kinds
    start: torch.Tensor    # µs since the trace's first event (float64: the ns difference over 1000)
    end: torch.Tensor
    thread: torch.Tensor   # index into ``tids``, in the order threads first appear
    sequence: torch.Tensor
    inputs: torch.Tensor   # code into ``input_lists``
    external: torch.Tensor  # the op it belongs to (kineto's External id; linking ops to kernels)
    correlation: torch.Tensor  # a runtime call's CUPTI correlation id (its kernels'), else 0
    device_read: torch.Tensor  # a runtime call whose copy is to the host (it waits for the device)
    row: torch.Tensor      # each event's row in the columns
    tree: EventTree
    kinds: list[EventKind]
    tids: list
    lanes: list[str]       # each thread's timeline lane (index: ``thread``)
    input_lists: list
    shapes: bool           # an op with shapes was read: each op's time is kept by its shapes
    flops: bool = False    # --flops: ops' FLOPs and tensor bytes are counted (summary_flops.py)


@dataclass
class Names:
    """Per kind code, what its name says (tensors indexed by the code)."""

    op: torch.Tensor        # an op (not a user range)
    phase: torch.Tensor     # the category of the phase it opens (phase_of), -1 for none
    sync: torch.Tensor      # SYNC_OPS
    copy: torch.Tensor      # COPY_OPS
    no_kernel: torch.Tensor  # NO_KERNEL_OPS
    backward_node: torch.Tensor
    step: torch.Tensor      # a ProfilerStep marker
    annotation: torch.Tensor  # a user range
    python: torch.Tensor    # a Python frame
    memory: torch.Tensor    # a memory record
    runtime: torch.Tensor   # a runtime (or driver) call
    launch: torch.Tensor    # a kernel launch call (kineto.LAUNCH_CALLS)
    sync_runtime: torch.Tensor  # a runtime call that waits for the device (categories.SYNC_RUNTIME)
    device: torch.Tensor    # a kernel, copy or memset
    user_frame: torch.Tensor  # a Python frame of the user's code (frames.is_user_frame)
    library_frame: torch.Tensor  # a Python frame of an installed package (frames.is_library_frame)
    counted: torch.Tensor   # an op with a FLOP formula (flops.counts_flops)
    name_id: torch.Tensor   # the same id for the same name under another category
    names: list[str]        # name_id -> name
    to_host: torch.Tensor   # by name id: a copy to the host (kineto.is_copy_to_host)
    pageable: torch.Tensor  # by name id: a copy from pageable host memory (kineto.is_pageable_upload)


def names_of(kinds: list[EventKind]) -> Names:
    """What each kind's name says, worked out once per kind (a trace repeats a few hundred)."""
    ids: dict[str, int] = {}
    name_id = [ids.setdefault(k.name, len(ids)) for k in kinds]

    def flag(test) -> torch.Tensor:
        return torch.tensor([bool(test(k)) for k in kinds], dtype=torch.bool)

    phases = [phase_of(k.name) for k in kinds]
    return Names(op=flag(lambda k: k.kind == OP),
                  phase=torch.tensor([-1 if p is None else CATEGORY[p] for p in phases], dtype=torch.long),
                  sync=flag(lambda k: k.name in SYNC_OPS), copy=flag(lambda k: k.name in COPY_OPS),
                  no_kernel=flag(lambda k: k.name in NO_KERNEL_OPS),
                  backward_node=flag(lambda k: is_backward_node(k.name)),
                  step=flag(lambda k: k.kind == ANNOTATION and k.name.startswith(STEP_PREFIX)),
                  annotation=flag(lambda k: k.kind == ANNOTATION), python=flag(lambda k: k.kind == PYTHON),
                  memory=flag(lambda k: k.kind == MEMORY), runtime=flag(lambda k: k.kind == RUNTIME),
                  launch=flag(lambda k: k.kind == RUNTIME and k.name in LAUNCH_CALLS),
                  sync_runtime=flag(lambda k: k.kind == RUNTIME and k.name in SYNC_RUNTIME),
                  device=flag(lambda k: k.kind == DEVICE),
                  user_frame=flag(lambda k: k.kind == PYTHON and is_user_frame(k.name)),
                  library_frame=flag(lambda k: k.kind == PYTHON and is_library_frame(k.name)),
                  counted=flag(lambda k: k.kind == OP and counts_flops(k.name)),
                  name_id=torch.tensor(name_id, dtype=torch.long), names=list(ids),
                  to_host=torch.tensor([is_copy_to_host(name) for name in ids], dtype=torch.bool),
                  pageable=torch.tensor([is_pageable_upload(name) for name in ids], dtype=torch.bool))


@dataclass
class Context:
    """What each event (visiting order) has when it is opened, from its parent's: the phase it is in, whether
    an op encloses it, whether it is in a sync or a copy the user asked for, its step (-1: outside the steps;
    a root not a marker is placed by its start) and its timeline bar (the index of the step's top-level event
    it is under, -1 for a marker or none), whether its own phase took over (the phase it opens, where none is
    open or it is a compile), the innermost frame of the user's code at or around it with the first library
    call that frame made, and the innermost user range at or around it (not a step marker; name ids, -1 for
    none); with --flops, the outermost op with a FLOP formula at or above it (its name id, -1 for none)."""

    phase: torch.Tensor
    under_op: torch.Tensor
    in_sync: torch.Tensor
    in_copy: torch.Tensor
    step: torch.Tensor
    top: torch.Tensor
    took: torch.Tensor
    frame: torch.Tensor
    library: torch.Tensor
    user_range: torch.Tensor
    flop_owner: torch.Tensor | None = None


def context_of(events: Events, names: Names, step_rows: torch.Tensor, windows, before: int) -> Context:
    """Each event's context; ``step_rows`` are the group's step markers, the last of the steps so far
    (``windows``, all the groups' up to this one's; ``before`` of them in the groups before)."""
    n, parent = len(events.kind), events.tree.parent
    own, is_op = names.phase[events.kind], names.op[events.kind]
    sync_op, copy_op = is_op & names.sync[events.kind], is_op & names.copy[events.kind]
    marker = torch.full((n,), -1, dtype=torch.long)
    marker[step_rows] = torch.arange(before, before + len(step_rows))
    name, user, library = names.name_id[events.kind], names.user_frame[events.kind], names.library_frame[events.kind]
    user_range = names.annotation[events.kind] & ~names.step[events.kind]
    ctx = Context(phase=own.clone(), under_op=torch.zeros(n, dtype=torch.bool), in_sync=sync_op | events.device_read,
                  in_copy=copy_op.clone(), step=marker.clone(), top=torch.full((n,), -1, dtype=torch.long),
                  took=own >= 0, frame=torch.where(user, name, -1), library=torch.full((n,), -1, dtype=torch.long),
                  user_range=torch.where(user_range, name, -1))
    counted = names.counted[events.kind] if events.flops else None
    if counted is not None:
        ctx.flop_owner = torch.where(counted, name, -1)
    roots = (parent < 0).nonzero().flatten()
    placed = window_of(windows, events.start[roots])  # work outside a marker, placed by time
    is_marker = marker[roots] >= 0
    ctx.step[roots] = torch.where(is_marker, marker[roots], placed)
    ctx.top[roots] = torch.where(~is_marker & (placed >= 0), roots, -1)
    for at in events.tree.levels():
        up = parent[at]
        phase, mine = ctx.phase[up], own[at]
        took = (mine >= 0) & ((phase < 0) | (mine == CATEGORY[START_UP]))
        ctx.took[at] = took
        ctx.phase[at] = torch.where(took, mine, phase)
        under = ctx.under_op[up] | is_op[up]
        ctx.under_op[at] = under
        # a copy to the host (.cpu(), .item(), print) waits for the device: a sync wherever it is made
        ctx.in_sync[at] = ctx.in_sync[up] | (sync_op[at] & ~under) | events.device_read[at]
        ctx.in_copy[at] = ctx.in_copy[up] | (copy_op[at] & ~under)
        step, top, here = ctx.step[up], ctx.top[up], marker[at]
        ctx.step[at] = torch.where(here >= 0, here, step)
        ctx.top[at] = torch.where(here >= 0, -1, torch.where((top < 0) & (step >= 0), at, top))
        frame, called = ctx.frame[up], ctx.library[up]  # a library's frame under a user's, the first one only
        ctx.frame[at] = torch.where(user[at], name[at], frame)
        ctx.library[at] = torch.where(user[at], -1, torch.where(library[at] & (frame >= 0) & (called < 0), name[at],
                                                                called))
        ctx.user_range[at] = torch.where(user_range[at], name[at], ctx.user_range[up])
        if counted is not None:  # beneath a counted op nothing is counted: its breakdown is in its formula
            owner = ctx.flop_owner[up]
            ctx.flop_owner[at] = torch.where(owner >= 0, owner, ctx.flop_owner[at])
    return ctx


def category_of(names: Names, kind: torch.Tensor, ctx: Context, at: torch.Tensor) -> torch.Tensor:
    """The category of the events ``at`` (codes into CATEGORIES), the first that holds: the phase they are in,
    a sync (asked for, or a runtime call that waits), a copy asked for, an op's or a runtime call's own work
    (forward), else other (Python between ops, user ranges' own time)."""
    phase = ctx.phase[at]
    sync = ctx.in_sync[at] | names.sync_runtime[kind[at]]
    work = names.op[kind[at]] | names.runtime[kind[at]]
    return torch.where(phase >= 0, phase, torch.where(sync, CATEGORY[SYNCS], torch.where(
        ctx.in_copy[at], CATEGORY[COPIES], torch.where(work, CATEGORY[FORWARD], CATEGORY[OTHER]))))


def window_of(windows, t: torch.Tensor) -> torch.Tensor:
    """The step window holding each of the times ``t`` (``windows``: (start, end) pairs by start): the last to
    start at or before it, where it ends after it; else -1."""
    if not windows:
        return torch.full_like(t, -1, dtype=torch.long)
    starts = torch.tensor([w[0] for w in windows], dtype=torch.float64)
    ends = torch.tensor([w[1] for w in windows], dtype=torch.float64)
    i = torch.searchsorted(starts, t, right=True) - 1
    inside = (i >= 0) & (t < ends[i.clamp(min=0)])
    return torch.where(inside, i, -1)
