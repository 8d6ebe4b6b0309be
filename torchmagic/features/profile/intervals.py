"""Arithmetic on [start, end) times held as tensors (float64 µs): any intervals merged (in start order, each
joining the one before where it starts at or before the furthest end so far; an interval of no length kept where
nothing covers it: whether any is left is read), two merged sets' intersection and difference (of positive
length) and their overlap, a set's length inside each of many windows, and many groups' unions' lengths at once;
and :class:`IntervalSet`, a union built from batches (a rank's busy time, the summary's waiting).

A set is an (n, 2) tensor of sorted, disjoint intervals.  Each endpoint is one of the inputs' own (no arithmetic
on times), so a set is exact; only a total, a sum of lengths, depends on the order of its additions.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence

import torch

from .array_views import doubles

PENDING_ROWS = 1 << 16  # IntervalSet.add_all's intervals held before they are joined: 1 MiB
EMPTY = torch.empty(0, 2, dtype=torch.float64)


def as_set(pairs) -> torch.Tensor:
    """A list of (start, end) pairs (or a set already) as a tensor of intervals."""
    if isinstance(pairs, torch.Tensor):
        return pairs
    return torch.tensor(pairs, dtype=torch.float64).view(-1, 2) if len(pairs) else EMPTY


def union(*sets: torch.Tensor) -> torch.Tensor:
    """Intervals (in any order, overlapping or not) merged into a set: sorted by start (then end), each joining
    the one before where it starts at or before the furthest end so far."""
    intervals = as_set(sets[0]) if len(sets) == 1 else torch.cat([as_set(s) for s in sets])
    if not len(intervals):
        return EMPTY
    starts, ends = intervals[:, 0], intervals[:, 1]
    if not bool((starts[1:] >= starts[:-1]).all()):  # (most sets come in order: no sort, no copies; ties merge alike)
        order = torch.argsort(ends, stable=True)
        order = order[torch.argsort(starts[order], stable=True)]
        starts, ends = starts[order], ends[order]
    reach = torch.cummax(ends, 0).values
    new = torch.ones(len(starts), dtype=torch.bool)
    new[1:] = starts[1:] > reach[:-1]
    first = new.nonzero().flatten()
    last = torch.cat([first[1:] - 1, torch.tensor([len(starts) - 1])])
    return torch.stack([starts[first], reach[last]], dim=1)


def intersection(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where two sets overlap (for some length): a sweep over their boundaries in time order, a start before an
    end at the same time, keeping the stretches both cover."""
    return _covered(torch.cat([as_set(a), as_set(b)]), 2)


def total(a: torch.Tensor) -> float:
    return float((a[:, 1] - a[:, 0]).sum()) if len(a) else 0.0


def overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total length where two sets overlap."""
    return total(intersection(a, b))


def difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where ``a`` covers and ``b`` does not (for some length): a sweep over both sets' boundaries in time order,
    keeping the stretches after which ``a`` covers and ``b`` not."""
    a, b = as_set(a), as_set(b)
    times = torch.cat([a[:, 0], a[:, 1], b[:, 0], b[:, 1]])
    one_a, one_b = torch.ones(len(a), dtype=torch.long), torch.ones(len(b), dtype=torch.long)
    in_a = torch.cat([one_a, -one_a, torch.zeros(2 * len(b), dtype=torch.long)])
    in_b = torch.cat([torch.zeros(2 * len(a), dtype=torch.long), one_b, -one_b])
    order = torch.argsort(times, stable=True)
    times, in_a, in_b = times[order], torch.cumsum(in_a[order], 0), torch.cumsum(in_b[order], 0)
    kept = (in_a[:-1] > 0) & (in_b[:-1] == 0) & (times[1:] > times[:-1])
    return union(torch.stack([times[:-1][kept], times[1:][kept]], dim=1))


def within_each(a: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
    """A merged set's length inside each window ((n, 2) starts and ends): what it covers up to the window's end,
    less what it covers up to its start (the set's lengths summed once, in order)."""
    a, windows = as_set(a), as_set(windows)
    if not len(a):
        return torch.zeros(len(windows), dtype=torch.float64)
    starts, lengths = a[:, 0].contiguous(), a[:, 1] - a[:, 0]
    before = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(lengths, 0)[:-1]])

    def covered(t: torch.Tensor) -> torch.Tensor:  # the set's length up to t
        last = torch.searchsorted(starts, t.contiguous(), right=True) - 1
        at = last.clamp(min=0)
        return torch.where(last >= 0, before[at] + torch.minimum((t - starts[at]).clamp(min=0.0), lengths[at]), 0.0)

    return (covered(windows[:, 1]) - covered(windows[:, 0])).clamp(min=0.0)


def _covered(intervals: torch.Tensor, depth: int) -> torch.Tensor:
    """The stretches of positive length covered by at least ``depth`` of ``intervals``."""
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


def grouped_totals(group: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, groups: int) -> torch.Tensor:
    """Each group's union's length (``group``: each interval's, in [0, groups)), summed piece by piece in start
    order as IntervalSet.total sums its merged pieces (the same floats); intervals of no length left
    out.  A running maximum of the ends within each group (a segmented scan, by doubling) says where a piece
    ends: the next interval of its group starts past it."""
    kept = ends > starts
    group, starts, ends = group[kept], starts[kept], ends[kept]
    order = torch.argsort(starts, stable=True)
    order = order[torch.argsort(group[order], stable=True)]
    group, starts, ends = group[order], starts[order], ends[order]
    reach, step = ends.clone(), 1
    while step < len(reach):
        same = group[step:] == group[:-step]  # groups are runs: the same group k back means all between are too
        reach[step:] = torch.where(same, torch.maximum(reach[step:], reach[:-step]), reach[step:])
        step *= 2
    opens = torch.ones(len(starts), dtype=torch.bool)
    opens[1:] = (group[1:] != group[:-1]) | (starts[1:] > reach[:-1])
    first = opens.nonzero().flatten()
    last = torch.cat([first[1:] - 1, torch.tensor([len(starts) - 1])]) if len(first) else first
    return torch.zeros(groups, dtype=torch.float64).scatter_add_(0, group[first], reach[last] - starts[first])


class IntervalSet:
    """A union of [start, end) intervals, added in batches of tensors in any order (held until PENDING_ROWS of
    them came, then joined: one union of many batches rather than a few tensor calls for each), or made at once
    from pairs (``of``)."""

    __slots__ = ("_set", "_pending", "_pending_rows", "_merged")

    def __init__(self):
        self._set = EMPTY                       # the union of what was joined
        self._pending: list[torch.Tensor] = []  # add_all's intervals not joined yet
        self._pending_rows = 0
        self._merged: tuple[array, array] | None = None

    @classmethod
    def of(cls, intervals) -> IntervalSet:
        """The union of ``intervals`` ((start, end) pairs or a set, any order; those of no length left out)."""
        result = cls()
        given = as_set(intervals)
        result._set = union(given[given[:, 1] > given[:, 0]])
        return result

    def add_all(self, starts: torch.Tensor, ends: torch.Tensor) -> None:
        """Many intervals at once (tensors of floats), kept as their union (those of no length left out)."""
        if not len(starts):
            return
        self._merged = None
        self._pending.append(torch.stack([starts, ends], dim=1))
        self._pending_rows += len(starts)
        if self._pending_rows >= PENDING_ROWS:
            self._join_pending()

    def _join_pending(self) -> None:
        given = torch.cat(self._pending)
        self._pending, self._pending_rows = [], 0
        self._set = union(self._set, given[given[:, 1] > given[:, 0]])

    def tensor(self) -> torch.Tensor:
        """The union as an (n, 2) tensor of sorted, disjoint intervals."""
        if self._pending:
            self._join_pending()
        return self._set

    def merged(self) -> tuple[array, array]:
        """Sorted, disjoint starts and ends (arrays of floats: 16 bytes an interval)."""
        if self._merged is None:
            merged = self.tensor()
            self._merged = (doubles(merged[:, 0]), doubles(merged[:, 1]))
        return self._merged

    def total(self) -> float:
        starts, ends = self.merged()
        return sum(e - s for s, e in zip(starts, ends))

    def within_each(self, windows: Sequence[tuple[float, float]]) -> list[float]:
        """The union's length inside each [start, end) of ``windows``."""
        return within_each(self.tensor(), as_set(windows)).tolist()

    def overlap(self, other: IntervalSet) -> float:
        """Total length where this union and ``other``'s overlap."""
        return overlap(self.tensor(), other.tensor())

    def minus(self, other: IntervalSet) -> IntervalSet:
        """This union less ``other``'s."""
        return IntervalSet.of(difference(self.tensor(), other.tensor()))

    def union(self, *others: IntervalSet) -> IntervalSet:
        return IntervalSet.of(union(*(part.tensor() for part in (self, *others))))

    def clipped(self, start: float, end: float) -> list[tuple[float, float]]:
        """The union's pieces inside [start, end), for drawing."""
        starts, ends = self.merged()
        i = max(bisect.bisect_right(starts, start) - 1, 0)
        pieces = []
        while i < len(starts) and starts[i] < end:
            lo, hi = max(starts[i], start), min(ends[i], end)
            if hi > lo:
                pieces.append((lo, hi))
            i += 1
        return pieces
