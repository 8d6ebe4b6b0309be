"""intervals.py's arithmetic on [start, end) times held as tensors (float64 µs): any intervals merged, two
merged sets' intersection and their overlap, by a sweep over their boundaries sorted once.

A set is an (n, 2) tensor of sorted, disjoint intervals of positive length.  intervals.union also keeps an
isolated interval of no length; no total, overlap or intersection reads one, so these leave them out.  Each
endpoint is one of the inputs' own (no arithmetic on times), so a total differs from intervals.py's only by
the order of its sum.
"""

from __future__ import annotations

import torch

EMPTY = torch.empty(0, 2, dtype=torch.float64)


def as_set(pairs) -> torch.Tensor:
    """A list of (start, end) pairs (or a set already) as a tensor of intervals."""
    if isinstance(pairs, torch.Tensor):
        return pairs
    return torch.tensor(pairs, dtype=torch.float64).view(-1, 2) if len(pairs) else EMPTY


def union(*sets: torch.Tensor) -> torch.Tensor:
    """Intervals (in any order, overlapping or not) merged into a set."""
    return _covered(torch.cat([as_set(s) for s in sets]), 1)


def intersection(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where two sets overlap."""
    return _covered(torch.cat([as_set(a), as_set(b)]), 2)


def total(a: torch.Tensor) -> float:
    return float((a[:, 1] - a[:, 0]).sum()) if len(a) else 0.0


def overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total length where two sets overlap."""
    return total(intersection(a, b))


def _covered(intervals: torch.Tensor, depth: int) -> torch.Tensor:
    """The stretches covered by at least ``depth`` of ``intervals``: their boundaries in time order, a start
    before an end at the same time (so union merges intervals that touch, as intervals.union does; where two
    sets touch, their intersection is a stretch of no length, left out)."""
    intervals = intervals[intervals[:, 1] > intervals[:, 0]]
    if not len(intervals):
        return EMPTY
    times = torch.cat([intervals[:, 0], intervals[:, 1]])
    steps = torch.cat([torch.ones(len(intervals), dtype=torch.long), -torch.ones(len(intervals), dtype=torch.long)])
    order = torch.argsort(-steps, stable=True)  # starts first ...
    order = order[torch.argsort(times[order], stable=True)]  # ... then by time
    times, count = times[order], torch.cumsum(steps[order], 0)
    inside = count >= depth
    before = torch.cat([torch.zeros(1, dtype=torch.bool), inside[:-1]])
    starts, ends = times[inside & ~before], times[~inside & before]
    keep = ends > starts
    return torch.stack([starts[keep], ends[keep]], dim=1)
