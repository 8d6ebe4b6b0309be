"""column_intervals.py against plain loops over sorted lists (test_intervals.py's oracle) on random intervals:
the same merged stretches (an isolated one of no length included), intersections and overlaps."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import torch

from torchmagic.features.profile import intervals
from torchmagic.features.profile import column_intervals

from .test_intervals import intersection, overlap, union

# starts on a coarse grid (so intervals touch and coincide often) or anywhere; lengths 0 now and then
_TIMES = st.one_of(st.integers(0, 20).map(float), st.floats(0, 100, allow_nan=False))
_INTERVALS = st.lists(st.tuples(_TIMES, st.one_of(st.just(0.0), st.integers(0, 5).map(float),
                                                  st.floats(0, 10, allow_nan=False))).map(lambda p: (p[0], p[0] + p[1])),
                      max_size=30)


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(a=_INTERVALS, b=_INTERVALS)
def test_the_same_as_plain_loops(a, b):
    ua, ub = union(a), union(b)
    ca, cb = column_intervals.union(a), column_intervals.union(b)
    assert ua == [tuple(iv) for iv in ca.tolist()]
    assert list(intersection(ua, ub)) == [tuple(iv) for iv in column_intervals.intersection(ca, cb).tolist()]
    assert abs(overlap(ua, ub) - column_intervals.overlap(ca, cb)) < 1e-9
    assert abs(sum(end - start for start, end in ua) - column_intervals.total(ca)) < 1e-9
    assert column_intervals.union(ca, b).tolist() == column_intervals.union(a + b).tolist()


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(rows=st.lists(st.tuples(st.integers(0, 4), _INTERVALS.map(lambda ivs: ivs[:1] or [(0.0, 0.0)])),
                                max_size=60))
def test_each_groups_union_is_what_an_interval_set_sums(rows):
    """grouped_totals against an IntervalSet per group, to the bit (the same pieces summed in the same order)."""
    group = torch.tensor([g for g, _ in rows], dtype=torch.long)
    starts = torch.tensor([ivs[0][0] for _, ivs in rows], dtype=torch.float64)
    ends = torch.tensor([ivs[0][1] for _, ivs in rows], dtype=torch.float64)
    sets = [intervals.IntervalSet() for _ in range(5)]
    for g, ivs in rows:
        sets[g].add(*ivs[0])
    assert column_intervals.grouped_totals(group, starts, ends, 5).tolist() == [float(s.total()) for s in sets]
