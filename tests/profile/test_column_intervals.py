"""column_intervals.py against intervals.py on random intervals: the same merged stretches (an isolated one
of no length included), intersections and overlaps."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st

from torchmagic.features.profile import intervals
from torchmagic.features.profile import column_intervals

# starts on a coarse grid (so intervals touch and coincide often) or anywhere; lengths 0 now and then
_TIMES = st.one_of(st.integers(0, 20).map(float), st.floats(0, 100, allow_nan=False))
_INTERVALS = st.lists(st.tuples(_TIMES, st.one_of(st.just(0.0), st.integers(0, 5).map(float),
                                                  st.floats(0, 10, allow_nan=False))).map(lambda p: (p[0], p[0] + p[1])),
                      max_size=30)


@hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
@hypothesis.given(a=_INTERVALS, b=_INTERVALS)
def test_the_same_as_intervals_py(a, b):
    ua, ub = intervals.union(a), intervals.union(b)
    ca, cb = column_intervals.union(a), column_intervals.union(b)
    assert ua == [tuple(iv) for iv in ca.tolist()]
    assert list(intervals.intersection(ua, ub)) == [tuple(iv) for iv in column_intervals.intersection(ca, cb).tolist()]
    assert abs(intervals.overlap(ua, ub) - column_intervals.overlap(ca, cb)) < 1e-9
    assert abs(sum(end - start for start, end in ua) - column_intervals.total(ca)) < 1e-9
    assert column_intervals.union(ca, b).tolist() == column_intervals.union(a + b).tolist()
