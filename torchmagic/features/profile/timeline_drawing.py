"""The report's timeline picture, drawn as SVG: a lane per CPU thread and GPU stream, bars coloured by
category, a dashed line where each profiled step starts.  As cheap as the report's tables (the bars are
already bounded to about one per pixel by timeline.py)."""

from __future__ import annotations

from collections import defaultdict
from html import escape

from ...core.render import svg

WIDTH = 1000          # px, as the 10-inch figure it replaces
LEGEND_PX = 30        # the legend's row above the lanes
AXIS_PX = 58          # the time axis below them: ticks, their labels, the axis' title
RIGHT_PX = 16
GREY = "#59636e"
AXIS_TITLE = "time since the first profiled step (ms); gaps are Python or idle time"


def timeline_svg(spans, colors: dict[str, str], step_starts_us=()) -> str:
    """The drawing's SVG text, for spans with lane, start_us, dur_us and category."""
    lanes = sorted({s.lane for s in spans}, key=lambda lane: (lane != "CPU", lane))
    t0 = min([s.start_us for s in spans] + list(step_starts_us))
    end_ms = max([(s.start_us + s.dur_us - t0) / 1e3 for s in spans] + [(t - t0) / 1e3 for t in step_starts_us])
    left = 18 + max(svg.text_width(lane, 12) for lane in lanes)
    pad = 0.03 * (end_ms or 1.0)
    x_of = _scale(-pad, end_ms + pad, left, WIDTH - RIGHT_PX)
    lane_px = 42 + 85 / len(lanes)  # as the figure it replaces: 0.55 in a lane + 1.1 in, 77% of it for the lanes
    bottom = LEGEND_PX + lane_px * len(lanes)
    body = _bars(spans, lanes, colors, x_of, t0, lane_px)
    body += _steps(step_starts_us, t0, x_of, bottom)
    body += _axes(lanes, left, bottom, x_of, (-pad, end_ms + pad), lane_px)
    body += _legend([c for c in colors if any(s.category == c for s in spans)], colors, left)
    return svg.document(WIDTH, bottom + AXIS_PX, body)


def _scale(low: float, high: float, x_low: float, x_high: float):
    per = (x_high - x_low) / ((high - low) or 1.0)
    return lambda value: x_low + (value - low) * per


def _bars(spans, lanes: list[str], colors: dict[str, str], x_of, t0: float, lane_px: float) -> list[str]:
    """One path per lane and category: a rectangle per span (76% of its lane's height), at least a
    tenth of a pixel wide."""
    paths: dict[tuple[str, str], list[str]] = defaultdict(list)
    height = 0.76 * lane_px
    for s in spans:
        x = x_of((s.start_us - t0) / 1e3)
        width = max(x_of((s.start_us + s.dur_us - t0) / 1e3) - x, 0.1)
        y = LEGEND_PX + lane_px * lanes.index(s.lane) + (lane_px - height) / 2
        paths[(s.lane, s.category)].append(f"M{x:.1f} {y:.1f}h{width:.1f}v{height:.1f}h{-width:.1f}z")
    return [f'<path fill="{escape(colors.get(category, "#888"))}" d="{"".join(parts)}"/>'
            for (_, category), parts in paths.items()]


def _steps(step_starts_us, t0: float, x_of, bottom: float) -> list[str]:
    """A dashed line where each step starts, named while there are few enough to read."""
    out = []
    for i, start in enumerate(step_starts_us):
        x = x_of((start - t0) / 1e3)
        out.append(f'<line x1="{x:.1f}" y1="{LEGEND_PX}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="{GREY}" '
                   f'stroke-width="0.8" stroke-dasharray="4 2"/>')
        if len(step_starts_us) <= 12:
            out.append(svg.text(x + 3, bottom - 3, f"step {i}", 9.5, color=GREY))
    return out


def _axes(lanes: list[str], left: float, bottom: float, x_of, x_range: tuple[float, float],
          lane_px: float) -> list[str]:
    """The lanes' names on the left, the time axis below: two spines, as the report's other plots."""
    out = [f'<path stroke="#000" stroke-width="0.8" fill="none" d="M{left:.1f} {LEGEND_PX}V{bottom:.1f}H{WIDTH - RIGHT_PX}"/>']
    for i, lane in enumerate(lanes):
        y = LEGEND_PX + lane_px * (i + 0.5)
        out.append(f'<path stroke="#000" stroke-width="0.8" d="M{left - 4:.1f} {y:.1f}h4"/>')
        out.append(svg.text(left - 7, y + 4, lane, 12, "end"))
    for tick in svg.nice_ticks(*x_range):
        x = x_of(tick)
        out.append(f'<path stroke="#000" stroke-width="0.8" d="M{x:.1f} {bottom:.1f}v4"/>')
        out.append(svg.text(x, bottom + 18, svg.tick_label(tick), 12, "middle"))
    out.append(svg.text((left + WIDTH - RIGHT_PX) / 2, bottom + 42, AXIS_TITLE, 13, "middle"))
    return out


def _legend(categories: list[str], colors: dict[str, str], left: float) -> list[str]:
    out, x = [], left
    for category in categories:
        out.append(f'<rect x="{x:.1f}" y="8" width="17" height="10" fill="{escape(colors[category])}"/>')
        out.append(svg.text(x + 23, 17, category, 10.5))
        x += 23 + svg.text_width(category, 10.5) + 22
    return out
