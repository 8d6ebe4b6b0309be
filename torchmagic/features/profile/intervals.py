"""Interval arithmetic on [start, end) times (µs), in one place: on sorted, disjoint lists of pairs
for a profile held in memory (trace.py), and as :class:`IntervalSet` for traces read as streams
(traces/), built from events in any order in memory proportional to the union.

Trace events nest (an op inside its parent) and mostly arrive in start order per thread, so
merging each new interval into the one being built keeps only the top-level spans; whatever
arrives out of order is merged again when the set is closed.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterable, Iterator, Sequence

Pairs = Sequence[tuple[float, float]]  # sorted and disjoint


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Any intervals merged into a sorted, disjoint list."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def intersection(a: Pairs, b: Pairs) -> Iterator[tuple[float, float]]:
    """Where two sorted, disjoint lists overlap, in order."""
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            yield lo, hi
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1


def overlap(a: Pairs, b: Pairs) -> float:
    """Total length where two sorted, disjoint lists overlap."""
    return sum(hi - lo for lo, hi in intersection(a, b))


def subtract(a: Pairs, b: Pairs) -> Iterator[tuple[float, float]]:
    """The parts of ``a`` that ``b`` does not cover, in order (both sorted and disjoint)."""
    j = 0
    for start, end in a:
        cursor = start
        while j < len(b) and b[j][1] <= cursor:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                yield cursor, b[k][0]
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            yield cursor, end


def near(intervals: Pairs, start: float, end: float) -> Pairs:
    """The members of a sorted, disjoint list that can overlap [start, end)."""
    first = max(bisect.bisect_right(intervals, (start, math.inf)) - 1, 0)
    last = bisect.bisect_left(intervals, (end, -math.inf))
    return intervals[first:last]


class _Pairs(Sequence):
    """Parallel arrays of starts and ends seen as a sequence of pairs, without building one."""

    __slots__ = ("starts", "ends")

    def __init__(self, starts: array, ends: array):
        self.starts, self.ends = starts, ends

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i):
        return self.starts[i], self.ends[i]

    def __iter__(self):
        return zip(self.starts, self.ends)


class IntervalSet:
    """A union of [start, end) intervals: add them in any order, then read the merged union."""

    __slots__ = ("_starts", "_ends", "_open", "_merged")

    def __init__(self):
        self._starts, self._ends = array("d"), array("d")
        self._open: list[float] | None = None   # [start, end] being extended
        self._merged: tuple[array, array] | None = None

    def add(self, start: float, end: float) -> None:
        if end <= start:
            return
        self._merged = None
        current = self._open
        if current is not None and current[0] <= start <= current[1]:
            if end > current[1]:
                current[1] = end
            return
        if current is not None:
            self._starts.append(current[0])
            self._ends.append(current[1])
        self._open = [start, end]

    def merged(self) -> tuple[array, array]:
        """Sorted, disjoint starts and ends (arrays of floats: 16 bytes an interval)."""
        if self._merged is None:
            raw_starts, raw_ends = array("d", self._starts), array("d", self._ends)
            if self._open is not None:
                raw_starts.append(self._open[0])
                raw_ends.append(self._open[1])
            n = len(raw_starts)
            in_order = all(raw_starts[i] <= raw_starts[i + 1] for i in range(n - 1))
            order = range(n) if in_order else sorted(range(n), key=raw_starts.__getitem__)
            starts, ends = array("d"), array("d")
            for i in order:
                start, end = raw_starts[i], raw_ends[i]
                if ends and start <= ends[-1]:
                    if end > ends[-1]:
                        ends[-1] = end
                else:
                    starts.append(start)
                    ends.append(end)
            self._merged = (starts, ends)
        return self._merged

    def total(self) -> float:
        starts, ends = self.merged()
        return sum(e - s for s, e in zip(starts, ends))

    def within(self, start: float, end: float) -> float:
        """The union's length inside [start, end)."""
        starts, ends = self.merged()
        i = max(bisect.bisect_right(starts, start) - 1, 0)
        length = 0.0
        while i < len(starts) and starts[i] < end:
            length += max(0.0, min(ends[i], end) - max(starts[i], start))
            i += 1
        return length

    def minus(self, other: IntervalSet) -> IntervalSet:
        """This union less ``other``'s."""
        # ``other``'s pairs, read by index again and again, made tuples once (for the time of the subtraction)
        pieces = list(subtract(_Pairs(*self.merged()), list(zip(*other.merged()))))
        # sorted, each of some length, none touching the next (both unions are): add() would keep each as it is
        result = IntervalSet()
        result._starts = array("d", [start for start, _ in pieces])
        result._ends = array("d", [end for _, end in pieces])
        return result

    def union(self, *others: IntervalSet) -> IntervalSet:
        result = IntervalSet()
        for part in (self, *others):
            for start, end in zip(*part.merged()):
                result.add(start, end)
        return result

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
