"""Unions of [start, end) times (µs) as :class:`IntervalSet`, for traces read as streams (traces/) and the
operator summary's waiting (traces/columnar_waiting.py), built from events in any order in memory proportional
to the union.

Trace events nest (an op inside its parent) and mostly arrive in start order per thread, so
merging each new interval into the one being built keeps only the top-level spans; whatever
arrives out of order is merged again when the set is closed.  Closing, subtracting and joining
sets, and measuring one inside many windows, are column_intervals.py's work over tensors: a rank's
host work holds tens of thousands of spans, and a per-span loop was most of a rank's summary.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence

import torch

from . import column_intervals as sets
from .array_views import doubles, tensor_view

PENDING_ROWS = 1 << 16  # IntervalSet.add_all's intervals held before they are joined: 1 MiB


class IntervalSet:
    """A union of [start, end) intervals: add them in any order, then read the merged union."""

    __slots__ = ("_starts", "_ends", "_open", "_merged", "_pending", "_pending_rows")

    def __init__(self):
        self._starts, self._ends = array("d"), array("d")
        self._open: list[float] | None = None   # [start, end] being extended
        self._merged: tuple[array, array] | None = None
        self._pending: list[torch.Tensor] = []  # add_all's intervals, joined PENDING_ROWS at a time
        self._pending_rows = 0

    @classmethod
    def of(cls, intervals: Sequence[tuple[float, float]]) -> IntervalSet:
        """The union of ``intervals`` (any order; those of no length left out, as ``add`` leaves them)."""
        given = sets.as_set(intervals)
        return _closed(sets.union(given[given[:, 1] > given[:, 0]]))

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

    def add_all(self, starts: torch.Tensor, ends: torch.Tensor) -> None:
        """Many intervals at once (tensors of floats), kept as their union (those of no length left out, as
        ``add`` leaves them): held as they are until PENDING_ROWS of them came, then joined (one union of many
        batches' intervals, rather than a few tensor calls for each batch)."""
        if not len(starts):
            return
        self._merged = None
        self._pending.append(torch.stack([starts, ends], dim=1))
        self._pending_rows += len(starts)
        if self._pending_rows >= PENDING_ROWS:
            self._join_pending()

    def _join_pending(self) -> None:
        given = torch.cat(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_rows = [], 0
        given = given[given[:, 1] > given[:, 0]]
        if not len(given):
            return
        pieces = sets.union(given)
        if self._open is not None:
            self._starts.append(self._open[0])
            self._ends.append(self._open[1])
            self._open = None
        self._starts.extend(doubles(pieces[:, 0]))
        self._ends.extend(doubles(pieces[:, 1]))

    def merged(self) -> tuple[array, array]:
        """Sorted, disjoint starts and ends (arrays of floats: 16 bytes an interval)."""
        if self._pending:
            self._join_pending()
        if self._merged is None:
            raw = torch.stack([tensor_view(self._starts, torch.float64), tensor_view(self._ends, torch.float64)],
                              dim=1)
            if self._open is not None:
                raw = torch.cat([raw, torch.tensor([self._open], dtype=torch.float64)])
            merged = sets.union(raw)
            self._merged = (doubles(merged[:, 0]), doubles(merged[:, 1]))
        return self._merged

    def total(self) -> float:
        starts, ends = self.merged()
        return sum(e - s for s, e in zip(starts, ends))

    def within_each(self, windows: Sequence[tuple[float, float]]) -> list[float]:
        """The union's length inside each [start, end) of ``windows``."""
        return sets.within_each(self._set(), sets.as_set(windows)).tolist()

    def overlap(self, other: IntervalSet) -> float:
        """Total length where this union and ``other``'s overlap."""
        return sets.overlap(self._set(), other._set())

    def minus(self, other: IntervalSet) -> IntervalSet:
        """This union less ``other``'s."""
        return _closed(sets.difference(self._set(), other._set()))

    def union(self, *others: IntervalSet) -> IntervalSet:
        return _closed(sets.union(*(part._set() for part in (self, *others))))

    def _set(self) -> torch.Tensor:
        """The merged union as column_intervals holds a set."""
        starts, ends = self.merged()
        return torch.stack([tensor_view(starts, torch.float64), tensor_view(ends, torch.float64)], dim=1)

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


def _closed(merged: torch.Tensor) -> IntervalSet:
    """An IntervalSet holding a set column_intervals merged (sorted, disjoint, none of no length)."""
    result = IntervalSet()
    result._starts, result._ends = doubles(merged[:, 0]), doubles(merged[:, 1])
    result._merged = (result._starts, result._ends)
    return result
