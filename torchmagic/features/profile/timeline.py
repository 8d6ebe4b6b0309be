"""The timeline drawing's bars, bounded: a trace of any length draws as about one bar per pixel."""

from __future__ import annotations

from collections import defaultdict

from .result import TimelineSpan as Span
from .summary import TraceSummary

MAX_BARS_PER_LANE = 1000  # the drawing is ~1000 pixels wide


def bound_timeline(out: TraceSummary) -> None:
    """At most MAX_BARS_PER_LANE bars per lane, whatever the trace length: past that, bars are
    binned by time (about one bin per pixel of the drawing), each bin drawn as one bar in the
    category that took most of its time.  Every step stays on the timeline."""
    lanes: dict[str, list[Span]] = defaultdict(list)
    for span in out.timeline:
        lanes[span.lane].append(span)
    bounded: list[Span] = []
    for lane, spans in lanes.items():
        spans.sort(key=lambda s: s.start_us)
        if len(spans) <= MAX_BARS_PER_LANE:
            bounded += spans
            continue
        t0 = spans[0].start_us
        width = (max(s.start_us + s.dur_us for s in spans) - t0) / MAX_BARS_PER_LANE
        bins: dict[int, list[Span]] = defaultdict(list)
        for s in spans:
            bins[min(int((s.start_us - t0) / width), MAX_BARS_PER_LANE - 1)].append(s)
        bars: list[list] = []  # [start, end, category]
        for index in sorted(bins):
            members = bins[index]
            time_in: dict[str, float] = defaultdict(float)
            for s in members:
                time_in[s.category] += s.dur_us
            category = max(time_in, key=time_in.get)
            start = members[0].start_us
            end = max(s.start_us + s.dur_us for s in members)
            if bars and bars[-1][2] == category and start - bars[-1][1] <= width:
                bars[-1][1] = max(bars[-1][1], end)  # one bar across neighbouring bins
            else:
                bars.append([start, end, category])
        bounded += [Span(lane, start, end - start, category, "(binned)") for start, end, category in bars]
    out.timeline = bounded
