"""The timeline's bars bounded over tensors (timeline.add_bounded, the table summary's) against an oracle that
bounds Spans one at a time in Python (bound_timeline, below): the same bars, in the same order, to the bit,
whatever was on the timeline before; on lanes held and new, under and past the bound, with ties in start and in a bin's
categories, bars of no length and bars all at one instant."""

from __future__ import annotations

import copy
from collections import defaultdict

import hypothesis
import pytest
import torch
from hypothesis import strategies as st

from torchmagic.features.profile import timeline
from torchmagic.features.profile.result import TimelineSpan as Span
from torchmagic.features.profile.summary import TraceSummary
from torchmagic.features.profile.timeline import Bars, _joined, add_bounded

BOUND = 12  # bars per lane before binning here: small, so that most cases bin
CATEGORIES = ("forward", "backward", "other")
LANES = ("CPU main thread", "CPU thread 7", "GPU stream 7")


def bound_timeline(out: TraceSummary) -> None:
    """The oracle: ``out.timeline`` bounded a Span at a time (a lane past the bound binned by time, each bin
    in the category that took most of its time, the first on a tie)."""
    lanes: dict[str, list[Span]] = defaultdict(list)
    for span in out.timeline:
        lanes[span.lane].append(span)
    bounded: list[Span] = []
    for lane, spans in lanes.items():
        spans.sort(key=lambda s: s.start_us)
        if len(spans) <= timeline.MAX_BARS_PER_LANE:
            bounded += spans
            continue
        t0 = spans[0].start_us
        width = (max(s.start_us + s.dur_us for s in spans) - t0) / timeline.MAX_BARS_PER_LANE
        bins: dict[int, list[Span]] = defaultdict(list)
        for s in spans:
            bins[min(int((s.start_us - t0) / width), timeline.MAX_BARS_PER_LANE - 1) if width else 0].append(s)
        binned = []
        for index in sorted(bins):
            members = bins[index]
            time_in: dict[str, float] = defaultdict(float)
            for s in members:
                time_in[s.category] += s.dur_us
            binned.append((members[0].start_us, max(s.start_us + s.dur_us for s in members),
                           max(time_in, key=time_in.get)))
        bounded += _joined(lane, binned, width)
    out.timeline = bounded


@st.composite
def bars(draw, most: int = 60):
    """(lane, start, duration, category, name) rows: on a coarse grid (many ties) or a fine one."""
    grid = draw(st.sampled_from([1.0, 0.25, 1e-3]))
    durations = st.integers(0, 30) if draw(st.booleans()) else st.floats(0, 30)  # floats: sums round by order
    rows = draw(st.lists(st.tuples(st.integers(0, len(LANES) - 1), st.integers(0, 400), durations,
                                   st.integers(0, len(CATEGORIES) - 1), st.integers(0, 3)), max_size=most))
    return [(lane, start * grid + 1e6, dur * grid, category, name)
            for lane, start, dur, category, name in rows]


def _spans(rows) -> list[Span]:
    return [Span(LANES[lane], start, dur, CATEGORIES[category], f"op{name}") for lane, start, dur, category, name in rows]


def _columns(rows) -> Bars:
    def column(i, dtype):
        return torch.tensor([row[i] for row in rows], dtype=dtype)

    return Bars(list(LANES), column(0, torch.long), column(1, torch.float64), column(2, torch.float64),
                CATEGORIES, column(3, torch.long), [f"op{i}" for i in range(4)], column(4, torch.long))


def _both(held_rows, rows):
    """The timeline after ``held_rows`` were added and bounded, then ``rows``: by Spans and by tensors."""
    by_spans, by_tensors = TraceSummary(), TraceSummary()
    by_spans.timeline = _spans(held_rows)
    bound_timeline(by_spans)
    by_tensors.timeline = copy.copy(by_spans.timeline)
    by_spans.timeline += _spans(rows)
    bound_timeline(by_spans)
    add_bounded(by_tensors, _columns(rows))
    return by_spans.timeline, by_tensors.timeline


@hypothesis.settings(max_examples=400, deadline=None, derandomize=True,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])  # (the same bound each)
@hypothesis.given(held=bars(), added=bars())
def test_bounded_over_tensors_as_over_spans(monkeypatch_bound, held, added):
    spans, tensors = _both(held, added)
    assert tensors == spans  # dataclass equality: lane, start, duration, category, name, and the order


def test_a_lane_all_at_one_instant_is_one_bar(monkeypatch_bound):
    rows = [(0, 5.0, 0.0, 1, 0)] * (BOUND + 3)
    spans, tensors = _both([], rows)
    assert tensors == spans == [Span(LANES[0], 5.0, 0.0, CATEGORIES[1], timeline.BINNED)]


def test_a_tie_between_categories_goes_to_the_first_bar_in_the_order_added(monkeypatch_bound):
    filler = [(0, 1000.0 + i, 1.0, 2, 0) for i in range(BOUND)]  # past the bound: the lane is binned
    for first, second in ((0, 1), (1, 0)):
        rows = [(0, 0.0, 2.0, first, 0), (0, 0.0, 2.0, second, 1), *filler]
        spans, tensors = _both([], rows)
        assert tensors == spans and tensors[0].category == CATEGORIES[first]


def test_the_bound_holds_on_many_bars(monkeypatch_bound):
    rows = [(i % 2, float(i), 0.5, i % 3, i % 4) for i in range(5_000)]
    spans, tensors = _both(rows[:100], rows[100:])
    assert tensors == spans and len(spans) <= 2 * BOUND


@pytest.fixture
def monkeypatch_bound(monkeypatch):
    monkeypatch.setattr(timeline, "MAX_BARS_PER_LANE", BOUND)
