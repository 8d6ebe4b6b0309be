"""intervals.py's functions over tensors and IntervalSet's operations (closing a set, subtracting, joining,
overlapping, lengths inside windows, many groups' unions at once) against plain loops over sorted lists (the
module's, and a subtraction written here), on intervals of every shape: overlapping, touching, nested, of no
length (an isolated one kept by the functions), out of order, on a coarse grid (many equal ends) or a fine one;
and on integer intervals, against the set of unit times each covers."""

from __future__ import annotations

import random

import hypothesis
import torch
from hypothesis import strategies as st

from torchmagic.features.profile import intervals
from torchmagic.features.profile.intervals import IntervalSet


# the oracle: plain loops over sorted, disjoint lists of pairs
def union(intervals) -> list[tuple[float, float]]:
    """Any intervals merged into a sorted, disjoint list."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def intersection(a, b):
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


def overlap(a, b) -> float:
    """Total length where two sorted, disjoint lists overlap."""
    return sum(hi - lo for lo, hi in intersection(a, b))


def subtract(a, b):
    """The parts of sorted, disjoint ``a`` that sorted, disjoint ``b`` does not cover, in order: a loop."""
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


@st.composite
def _intervals(draw):
    grid = draw(st.sampled_from([4, 30, 10**6]))
    starts = draw(st.lists(st.integers(0, grid), max_size=40))
    lengths = draw(st.lists(st.one_of(st.just(0), st.just(1), st.integers(0, grid)), min_size=len(starts),
                            max_size=len(starts)))
    return [(s / 3, (s + n) / 3) for s, n in zip(starts, lengths)]  # thirds: not integers


def _set(intervals) -> IntervalSet:
    return IntervalSet.of(intervals)


def _pairs(intervals: IntervalSet) -> list[tuple[float, float]]:
    return list(zip(*intervals.merged()))


def _listed(intervals) -> list[tuple[float, float]]:
    """The plain union of the intervals that have a length (an IntervalSet drops the others)."""
    return union((s, e) for s, e in intervals if e > s)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(_intervals(), _intervals(), _intervals())
def test_the_set_operations_are_the_plain_loops(a, b, c):
    assert _pairs(_set(a)) == _listed(a)
    assert _pairs(_set(a).minus(_set(b))) == list(subtract(_listed(a), _listed(b)))
    assert _pairs(_set(a).union(_set(b), _set(c))) == _listed(a + b + c)
    shared = overlap(_listed(a), _listed(b))
    assert abs(_set(a).overlap(_set(b)) - shared) <= 1e-9 * max(1.0, shared)
    assert _pairs(_set(a).minus(_set(b)).union(_set(c)).minus(_set(a))) == \
        list(subtract(_listed(list(subtract(_listed(a), _listed(b))) + c), _listed(a)))


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(_intervals(), _intervals())
def test_the_length_inside_each_window_is_the_overlap(a, windows):
    got = _set(a).within_each(windows)
    for (start, end), length in zip(windows, got, strict=True):
        want = overlap(_listed(a), [(start, end)]) if end > start else 0.0
        assert abs(length - want) <= 1e-9 * max(1.0, want)


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(_intervals(), st.lists(st.integers(0, 40), max_size=6), st.integers(1, 50))
def test_many_at_once_as_one_by_one(a, cuts, pending):
    """add_all's chunks (held, then joined ``pending`` rows at a time) make the union of them all."""
    saved = intervals.PENDING_ROWS
    intervals.PENDING_ROWS = pending
    try:
        result, at = IntervalSet(), 0
        for cut in sorted(cuts) + [len(a)]:
            chunk = a[at:max(at, cut)]
            result.add_all(torch.tensor([s for s, _ in chunk], dtype=torch.float64),
                           torch.tensor([e for _, e in chunk], dtype=torch.float64))
            at = max(at, cut)
        assert _pairs(result) == _listed(a)
    finally:
        intervals.PENDING_ROWS = saved


# starts on a coarse grid (so intervals touch and coincide often) or anywhere; lengths 0 now and then
_TIMES = st.one_of(st.integers(0, 20).map(float), st.floats(0, 100, allow_nan=False))
_INTERVALS = st.lists(st.tuples(_TIMES, st.one_of(st.just(0.0), st.integers(0, 5).map(float),
                                                  st.floats(0, 10, allow_nan=False))).map(lambda p: (p[0], p[0] + p[1])),
                      max_size=30)


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(a=_INTERVALS, b=_INTERVALS)
def test_the_tensor_functions_are_the_plain_loops(a, b):
    ua, ub = union(a), union(b)
    ca, cb = intervals.union(a), intervals.union(b)
    assert ua == [tuple(iv) for iv in ca.tolist()]
    assert list(intersection(ua, ub)) == [tuple(iv) for iv in intervals.intersection(ca, cb).tolist()]
    assert abs(overlap(ua, ub) - intervals.overlap(ca, cb)) < 1e-9
    assert abs(sum(end - start for start, end in ua) - intervals.total(ca)) < 1e-9
    assert intervals.union(ca, b).tolist() == intervals.union(a + b).tolist()


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(rows=st.lists(st.tuples(st.integers(0, 4), _INTERVALS.map(lambda ivs: ivs[:1] or [(0.0, 0.0)])),
                                max_size=60))
def test_each_groups_union_is_what_an_interval_set_sums(rows):
    """grouped_totals against an IntervalSet per group, to the bit (the same pieces summed in the same order)."""
    group = torch.tensor([g for g, _ in rows], dtype=torch.long)
    starts = torch.tensor([ivs[0][0] for _, ivs in rows], dtype=torch.float64)
    ends = torch.tensor([ivs[0][1] for _, ivs in rows], dtype=torch.float64)
    runs = [[] for _ in range(5)]
    for g, ivs in rows:
        runs[g].append(ivs[0])
    assert intervals.grouped_totals(group, starts, ends, 5).tolist() == [float(IntervalSet.of(r).total()) for r in runs]


def test_interval_unions_agree_with_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        runs, grids = ([], []), (set(), set())
        for target, grid in zip(runs, grids):
            for _ in range(rng.randint(0, 12)):
                s = rng.randint(0, 90)
                e = s + rng.randint(0, 15)
                target.append((s, e))
                grid.update(range(s, e))
        (a, b), (grid_a, grid_b) = (IntervalSet.of(r) for r in runs), grids
        assert a.total() == len(grid_a)
        assert a.minus(b).total() == len(grid_a - grid_b)
        assert a.union(b).total() == len(grid_a | grid_b)
        lo = rng.randint(0, 100)
        hi = lo + rng.randint(0, 40)
        assert a.within_each([(lo, hi)]) == [len({t for t in grid_a if lo <= t < hi})]
        assert sum(e - s for s, e in a.clipped(lo, hi)) == a.within_each([(lo, hi)])[0]
        assert a.overlap(b) == len(grid_a & grid_b)
