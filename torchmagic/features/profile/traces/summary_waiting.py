"""The main thread's Python time that another thread's work overlapped, discounted (table_summary.py): on CUDA,
backward runs on an autograd thread while the main thread waits for it."""

from __future__ import annotations

import math

import torch

from ..categories import OTHER
from ..intervals import IntervalSet, as_set
from ..summary import TraceSummary
from ..timeline import MAIN_LANE


def discount_waiting(out: TraceSummary, bars: dict, python_gaps: list, windows,
                     before=()) -> list[tuple[float, float]]:
    """The main thread's gaps count as Python ("other") unless another thread worked meanwhile:
    on CUDA, backward runs on an autograd thread while the main thread waits for it.  The same holds
    for the Python time after each op called from Python.  ``bars``: the group's timeline bars by lane (a tensor
    of (start, end) rows each, or a list of such pairs); ``python_gaps``: the Python gaps (index, start, end)
    between ops called from Python (summary_totals.opened_totals);
    ``before``: other threads' work that began in the group of steps before; returns what of it and of this
    group's runs past its steps."""
    others = IntervalSet.of(torch.cat([as_set(ivs) for lane, ivs in bars.items() if lane != MAIN_LANE]
                                      + [as_set(list(before))]))
    worked = others.within_each([(start, end) for _, start, end in python_gaps]) if python_gaps else []
    for (index, start, end), meanwhile in zip(python_gaps, worked):
        out.python_gap_us[index] += end - start - meanwhile
    starts, ends = others.merged()
    if not starts:
        return []
    gaps = IntervalSet.of(windows).minus(IntervalSet.of(bars.get(MAIN_LANE, [])))
    out.category_us[OTHER] = max(out.category_us[OTHER] - gaps.overlap(others), 0.0)
    end = windows[-1][1] if windows else -math.inf
    return [(max(start, end), stop) for start, stop in zip(starts, ends) if stop > end]
