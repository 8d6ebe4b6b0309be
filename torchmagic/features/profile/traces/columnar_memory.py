"""Memory records in the columnar summary (columnar.py), as the sweep visits them (sweep._memory): each kept
with its time, device and bytes for the levels (summarizer.memory_levels), an allocation in a step added to its
device's total and to the op around it (the sweep's stack top when it visits the record: the record's parent)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..summary import TraceSummary
from .columnar_context import Events, Names, window_of
from .columnar_totals import visiting_keys


@dataclass
class MemoryColumns:
    """The memory records' rows in the columns (ascending), bytes and device codes (into ``devices``)."""

    rows: torch.Tensor
    nbytes: torch.Tensor
    device: torch.Tensor
    devices: list[str]


def memory_records(out: TraceSummary, events: Events, names: Names, memory: MemoryColumns, windows) -> tuple:
    """The group's memory records as (time, device, bytes) in visiting order, and the bytes they gave ops:
    (the ops' name ids, bytes, visiting keys)."""
    rows = names.memory[events.kind].nonzero().flatten()
    none = (torch.empty(0, dtype=torch.long),) * 3
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
    return records, (names.name_id[events.kind[parent[by_op]]], nbytes[by_op], visiting_keys(events.tree, rows[by_op]))
