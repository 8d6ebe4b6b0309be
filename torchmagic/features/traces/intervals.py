"""Unions of time intervals built from a stream of events, in memory proportional to the union.

Trace events nest (an op inside its parent) and mostly arrive in start order per thread, so
merging each new interval into the one being built keeps only the top-level spans; whatever
arrives out of order is merged again when the set is closed.  Times are µs as in the trace.
"""

from __future__ import annotations

import bisect
from array import array


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
        result = IntervalSet()
        a_starts, a_ends = self.merged()
        b_starts, b_ends = other.merged()
        j = 0
        for start, end in zip(a_starts, a_ends):
            while j < len(b_starts) and b_ends[j] <= start:
                j += 1
            k, cursor = j, start
            while k < len(b_starts) and b_starts[k] < end:
                if b_starts[k] > cursor:
                    result.add(cursor, b_starts[k])
                cursor = max(cursor, b_ends[k])
                k += 1
            if cursor < end:
                result.add(cursor, end)
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
