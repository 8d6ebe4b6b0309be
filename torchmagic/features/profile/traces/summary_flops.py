"""``--flops`` in the table summary (table_summary.py): each op's FLOPs at the outermost op with a formula and
nothing beneath it (flops.py), the bytes its tensors hold and a pointwise op's FLOPs (traffic.py), and which
counted op each op's kernels belong to.  The formulas run once per distinct (op, inputs) pair, not per call."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..flops import op_flops
from ..summary import TraceSummary
from ..traffic import tensor_traffic
from .summary_context import Context, Events, Names
from .summary_device import ColumnLinks, Keyed
from .fields import literal


def flop_totals(out: TraceSummary, events: Events, names: Names, ctx: Context, ops: torch.Tensor) -> None:
    """Add the FLOPs, tensor bytes and estimated pointwise FLOPs of ``ops`` (the ops in the steps, in closing
    order) to their rows of the operator table; an op's dtype is the first closed one's that has one."""
    if not len(ops):
        return
    parent = events.tree.parent[ops]
    above = torch.where(parent >= 0, ctx.flop_owner[parent.clamp(min=0)], -1)
    counting = names.counted[events.kind[ops]] & (above < 0)
    name, inputs = names.name_id[events.kind[ops]], events.inputs[ops].long()
    pairs, inverse = torch.unique(torch.stack([name, inputs, counting.long()], dim=1), dim=0, return_inverse=True)
    figures = [_figures(names.names[op], events.input_lists[code], bool(counts)) for op, code, counts in pairs.tolist()]
    count = len(names.names)
    flops, moved, pointwise = (
        torch.zeros(count, dtype=torch.long).scatter_add_(0, name, torch.tensor(
            [getattr(f, field) for f in figures], dtype=torch.long)[inverse]).tolist()
        for field in ("flops", "bytes", "pointwise_flops"))
    typed = torch.tensor([f.dtype is not None for f in figures], dtype=torch.bool)[inverse]
    first_typed = torch.full((count,), len(ops)).scatter_reduce_(0, name[typed], typed.nonzero().flatten(), "amin")
    for op in torch.unique(name).tolist():
        stats = out.ops[names.names[op]]
        stats.flops += flops[op]
        stats.bytes += moved[op]
        stats.estimated_flops += pointwise[op]
        if stats.dtype is None and int(first_typed[op]) < len(ops):
            stats.dtype = figures[int(inverse[first_typed[op]])].dtype


class _Figures(NamedTuple):
    """What one call of an op with given inputs weighs."""

    flops: int            # where the op is counted (the outermost with a formula), else 0
    bytes: int            # its tensors' bytes (traffic.tensor_traffic)
    dtype: str | None
    pointwise_flops: int  # estimated, for a pointwise op


def _figures(name: str, inputs: tuple, counts: bool) -> _Figures:
    shapes, dtypes, concrete = inputs
    moved, dtype, pointwise = tensor_traffic(name, shapes, dtypes)
    return _Figures(op_flops(name, shapes, [literal(v) for v in concrete]) if counts else 0, moved, dtype, pointwise)


def flop_links(links: ColumnLinks, events: Events, names: Names, ctx: Context) -> None:
    """Each op's id -> the name id of the counted op at or above it (the last opened of an id kept), for its
    kernels' device time (``OpStats.flop_device_us``)."""
    owned = names.op[events.kind] & (events.external != 0) & (ctx.flop_owner >= 0)
    links.flop_owner = Keyed.last_of(events.external[owned], ctx.flop_owner[owned])

