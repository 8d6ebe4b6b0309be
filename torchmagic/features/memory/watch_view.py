"""Text and HTML views of a :class:`WatchResult`, with the small inline chart its live view redraws each sample."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from ...core.render.base import report_html
from ...core.render.format import fmt_bytes, fmt_s

if TYPE_CHECKING:  # the result imports this view when it is shown, not the other way round
    from .watch_result import WatchResult

MAX_POINTS = 300  # points drawn per line: later samples are drawn, the rest thinned out


def headline(r: WatchResult) -> str:
    state = "watching" if r.running else "watched"
    cost = f"{r.cpu_seconds / r.seconds:.2%} of a core" if r.seconds > 0 else "–"
    return (f"%gpumem --watch: {state} {fmt_s(r.seconds)}, {len(r.samples)} samples every "
            f"{fmt_s(r.interval_s)} (the watch's own CPU: {cost})")


def lines(r: WatchResult) -> list[str]:
    if not r.samples:
        return ["no samples yet"]
    out = []
    labels = [d.label for d in r.samples[-1].devices]
    for i, label in enumerate(labels):
        series = [s.devices[i] for s in r.samples if len(s.devices) > i]
        parts = [f"{label}: torch allocated peak {fmt_bytes(_max(d.allocated_bytes for d in series))}, "
                 f"reserved peak {fmt_bytes(_max(d.reserved_bytes for d in series))}"]
        used = _max(d.used_bytes for d in series)
        if used is not None:
            parts.append(f"NVML used peak {fmt_bytes(used)}")
        busy = [d.utilization_pct for d in series if d.utilization_pct is not None]
        if busy:
            parts.append(f"utilisation mean {sum(busy) / len(busy):.0f}%, max {max(busy):.0f}%")
        out.append(", ".join(parts))
    rss = _max(s.rss_bytes for s in r.samples)
    out.append(f"host: resident peak {fmt_bytes(rss)}, least available "
               f"{fmt_bytes(min(s.available_bytes for s in r.samples))}")
    return out + r.notes


def _max(values):
    known = [v for v in values if v is not None]
    return max(known) if known else None


# -- text ------------------------------------------------------------------------------
def text(r: WatchResult) -> str:
    return "\n".join([headline(r), *lines(r)])


# -- HTML ------------------------------------------------------------------------------
def chart_svg(r: WatchResult, width: int = 640, height: int = 150) -> str:
    """Memory over time (torch allocated and NVML used per GPU, or host resident memory),
    and utilisation on a second scale, as inline SVG: cheap enough to redraw every sample."""
    samples = r.samples[-MAX_POINTS:]
    if len(samples) < 2:
        return ""
    t0, t1 = samples[0].t, samples[-1].t
    lines: list[tuple[str, str, list[tuple[float, float]], bool]] = []  # name, colour, points, is_pct
    palette = ["#0969da", "#1a7f37", "#8250df", "#bf8700"]
    for i, label in enumerate(d.label for d in samples[-1].devices):
        rows = [(s.t, s.devices[i]) for s in samples if len(s.devices) > i]
        lines.append((f"{label} torch allocated", palette[i % 4],
                      [(t, d.allocated_bytes) for t, d in rows if d.allocated_bytes is not None], False))
        lines.append((f"{label} NVML used", palette[(i + 1) % 4],
                      [(t, d.used_bytes) for t, d in rows if d.used_bytes is not None], False))
        lines.append((f"{label} utilisation", "#d1242f",
                      [(t, d.utilization_pct) for t, d in rows if d.utilization_pct is not None], True))
    if not samples[-1].devices:
        lines.append(("host resident", palette[0], [(s.t, s.rss_bytes) for s in samples if s.rss_bytes], False))
    top = max([v for _, _, pts, pct in lines if not pct for _, v in pts] or [1]) * 1.1
    pad, plot_w, plot_h = 4, width - 8, height - 30

    def xy(t: float, v: float, pct: bool) -> str:
        x = pad + (t - t0) / max(t1 - t0, 1e-9) * plot_w
        y = pad + plot_h - (v / 100 if pct else v / top) * plot_h
        return f"{x:.1f},{y:.1f}"

    dashed = ' stroke-dasharray="3 2"'
    paths = "".join(
        f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"{dashed if pct else ""} '
        f'points="{" ".join(xy(t, v, pct) for t, v in pts)}"/>'
        for _, colour, pts, pct in lines if len(pts) >= 2)
    legend = " · ".join(f'<tspan fill="{colour}">{escape(name)}</tspan>'
                        for name, colour, pts, _ in lines if len(pts) >= 2)
    return (f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" role="img">'
            f'<rect x="{pad}" y="{pad}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#d0d7de"/>'
            f'{paths}<text x="{pad}" y="{height - 14}" font-size="10">{legend}</text>'
            f'<text x="{pad}" y="{height - 2}" font-size="10" fill="#59636e">last {fmt_s(t1 - t0)}; memory '
            f'scale 0–{escape(fmt_bytes(top))}, utilisation 0–100% (dashed)</text></svg>')


def html(r: WatchResult) -> str:
    body = "".join(f'<div class="tm-note">{escape(line)}</div>' for line in lines(r))
    return report_html(f'<div class="tm-headline">{escape(headline(r))}</div>{chart_svg(r)}{body}')
