"""Memory records in the table summary (table_summary.py), in the order the nesting visits them: each kept with its
time, device and bytes for the levels (memory_levels), an allocation in a step added to its device's total and to
the op around it (the innermost open event when it is visited: the record's parent)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..summary import TraceSummary
from .summary_context import Events, Names, window_of


@dataclass
class MemoryColumns:
    """The memory records' rows in the columns (ascending), bytes and device codes (into ``devices``)."""

    rows: torch.Tensor
    nbytes: torch.Tensor
    device: torch.Tensor
    devices: list[str]


@dataclass
class OpAllocations:
    """The bytes memory records in the steps gave the ops they were visited under: the ops' name ids and bytes."""

    name: torch.Tensor
    nbytes: torch.Tensor


def memory_records(out: TraceSummary, events: Events, names: Names, memory: MemoryColumns,
                   windows) -> tuple[list[tuple[float, str, int]], OpAllocations]:
    """The group's memory records as (time, device, bytes) in visiting order, and the bytes they gave ops."""
    rows = names.memory[events.kind].nonzero().flatten()
    none = OpAllocations(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long))
    if not len(rows):
        return [], none
    out.memory_recorded = True
    slot = torch.searchsorted(memory.rows, events.row[rows])
    nbytes, device, start = memory.nbytes[slot], memory.device[slot].long(), events.start[rows]
    labels = [memory.devices[code] for code in device.tolist()]
    records = list(zip(start.tolist(), labels, nbytes.tolist()))
    placed = (nbytes > 0) & (window_of(windows, start) >= 0)  # an allocation in a step
    for label, allocated in zip((labels[i] for i in placed.nonzero().flatten().tolist()), nbytes[placed].tolist()):
        out.allocated_total[label] = out.allocated_total.get(label, 0) + allocated
    parent = events.tree.parent[rows]
    by_op = placed & (parent >= 0) & names.op[events.kind[parent.clamp(min=0)]]
    if not bool(by_op.any()):
        return records, none
    return records, OpAllocations(names.name_id[events.kind[parent[by_op]]], nbytes[by_op])


def memory_levels(out: TraceSummary, records: list[tuple[float, str, int]], windows, level: dict, base: dict,
                  last: bool) -> None:
    """Peak and final allocation level per device above the first step's start, in time order across
    threads: on CUDA, backward allocates on the autograd thread while the main thread's tensors live.
    Memory may be recorded from before the steps (run.py starts the profiler a warm-up step early: the
    CPU profiler reports no free of a block allocated before it started, so the gradients zero_grad
    frees would otherwise never leave the level); only the steps' records make the peak, and none after
    the last step.  ``level``, ``base``: each device's bytes allocated so far and its level at the first step's
    start, carried from one group of steps to the next (``last``: no step follows)."""
    if not windows:
        return
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
