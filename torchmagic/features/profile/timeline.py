"""The timeline drawing's bars, bounded: a trace of any length draws as about one bar per pixel."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from .result import TimelineSpan as Span
from .summary import TraceSummary

MAIN_LANE = "CPU main thread"  # the lane of the thread the steps ran on
MAX_BARS_PER_LANE = 1000  # the drawing is ~1000 pixels wide
BINNED = "(binned)"


@dataclass
class Bars:
    """Timeline bars as columns, in the order they are added: each one's lane (codes into ``lanes``), start and
    duration (µs, float64), category (codes into ``categories``) and name (codes into ``names``)."""

    lanes: list[str]
    lane: torch.Tensor
    start: torch.Tensor
    dur: torch.Tensor
    categories: list[str] | tuple[str, ...]
    category: torch.Tensor
    names: list[str]
    name: torch.Tensor


def add_bounded(out: TraceSummary, bars: Bars) -> None:
    """``out.timeline`` with ``bars`` added after its own, then bounded: at most MAX_BARS_PER_LANE bars per
    lane, whatever the trace length; past that, a lane's bars are binned by time (about one bin per pixel of
    the drawing), each bin drawn as one bar in the category that took most of its time (on a tie, the first
    added).  A bar is made a Span only where it is kept."""
    if not len(bars.lane):
        return
    held: dict[str, list[Span]] = defaultdict(list)
    for span in out.timeline:
        held[span.lane].append(span)
    rows_of: dict[str, list[torch.Tensor]] = {}
    codes, inverse = torch.unique(bars.lane, return_inverse=True)
    first = torch.full((len(codes),), len(inverse)).scatter_reduce_(0, inverse, torch.arange(len(inverse)), "amin")
    for code in codes[torch.argsort(first)].tolist():  # lanes in the order their first bar comes
        rows_of.setdefault(bars.lanes[code], []).append((bars.lane == code).nonzero().flatten())
    bounded: list[Span] = []
    for lane in [*held, *(lane for lane in rows_of if lane not in held)]:
        spans = held.get(lane, [])
        rows = torch.cat(rows_of[lane]).sort().values if lane in rows_of else torch.empty(0, dtype=torch.long)
        if len(spans) + len(rows) <= MAX_BARS_PER_LANE:
            spans = spans + [Span(lane, start, dur, bars.categories[c], bars.names[n]) for start, dur, c, n in zip(
                bars.start[rows].tolist(), bars.dur[rows].tolist(), bars.category[rows].tolist(),
                bars.name[rows].tolist())]
            spans.sort(key=lambda s: s.start_us)
            bounded += spans
        else:
            bounded += _binned_tensors(lane, spans, bars, rows)
    out.timeline = bounded


def _binned_tensors(lane: str, held: list[Span], bars: Bars, rows: torch.Tensor) -> list[Span]:
    """The bins of one lane (its spans held, then ``rows`` of ``bars``), over tensors."""
    categories = list(dict.fromkeys([*bars.categories, *(s.category for s in held)]))
    code = {c: i for i, c in enumerate(categories)}
    own = torch.tensor([code[c] for c in bars.categories], dtype=torch.long)
    start = torch.cat([torch.tensor([s.start_us for s in held], dtype=torch.float64), bars.start[rows]])
    dur = torch.cat([torch.tensor([s.dur_us for s in held], dtype=torch.float64), bars.dur[rows]])
    category = torch.cat([torch.tensor([code[s.category] for s in held], dtype=torch.long), own[bars.category[rows]]])
    order = torch.argsort(start, stable=True)
    start, dur, category = start[order], dur[order], category[order]
    end = start + dur
    t0 = start[0]
    width = float((end.max() - t0) / MAX_BARS_PER_LANE)
    index = ((start - t0) / width).long().clamp_(max=MAX_BARS_PER_LANE - 1) if width else torch.zeros_like(order)
    count, n = len(categories), len(start)
    key = index * count + category
    sums = torch.zeros(MAX_BARS_PER_LANE * count, dtype=torch.float64).scatter_add_(0, key, dur)
    first = torch.full((MAX_BARS_PER_LANE * count,), n).scatter_reduce_(0, key, torch.arange(n), "amin")
    sums = torch.where(first < n, sums, -torch.inf).view(MAX_BARS_PER_LANE, count)
    tied = sums == sums.max(dim=1, keepdim=True).values  # the first of the largest, as max() over a dict gives it
    dominant = torch.where(tied, first.view(MAX_BARS_PER_LANE, count), n).argmin(dim=1)
    opened = torch.full((MAX_BARS_PER_LANE,), n).scatter_reduce_(0, index, torch.arange(n), "amin")
    closed = torch.full((MAX_BARS_PER_LANE,), -torch.inf, dtype=torch.float64).scatter_reduce_(0, index, end, "amax")
    used = (opened < n).nonzero().flatten()
    binned = zip(start[opened[used]].tolist(), closed[used].tolist(),
                 [categories[c] for c in dominant[used].tolist()])
    return _joined(lane, binned, width)


def _joined(lane: str, binned, width: float) -> list[Span]:
    """Bins (start, end, category) in time order as bars: one bar across neighbouring bins of one category."""
    bars: list[list] = []  # [start, end, category]
    for start, end, category in binned:
        if bars and bars[-1][2] == category and start - bars[-1][1] <= width:
            bars[-1][1] = max(bars[-1][1], end)
        else:
            bars.append([start, end, category])
    return [Span(lane, start, end - start, category, BINNED) for start, end, category in bars]
