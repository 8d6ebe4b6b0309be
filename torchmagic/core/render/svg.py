"""Pictures drawn as SVG text, without matplotlib (~0.3 s to import, ~0.1 s a PNG): an axis's ticks
and the <img> that inlines a drawing, so it shows wherever the report's HTML does, kernel or not."""

from __future__ import annotations

import base64
import html
import math

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"


def svg_img(svg: str, alt: str) -> str:
    """The drawing inlined as a data URI in an <img> (sanitisers keep an image where they strip an
    inline <svg>); it scales down with the output's width."""
    data = base64.b64encode(svg.encode()).decode()
    return f'<img alt="{html.escape(alt)}" style="max-width:100%" src="data:image/svg+xml;base64,{data}"/>'


def nice_ticks(low: float, high: float, about: int = 8) -> list[float]:
    """Round tick values covering [low, high], about ``about`` of them (1, 2, 2.5 or 5 times a power of 10)."""
    span = high - low
    if not span > 0 or not math.isfinite(span):
        return [low]
    raw = span / about
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9)
    return [round(i * step, 10) for i in range(first, math.floor(high / step + 1e-9) + 1)]


def tick_label(value: float) -> str:
    return f"{value:g}"


def text_width(text: str, size_px: float) -> float:
    """A sans-serif text's width, estimated (no font metrics without a renderer): enough to lay out."""
    return len(text) * size_px * 0.58


def text(x: float, y: float, content: str, size_px: float = 11, anchor: str = "start",
         color: str = "#000") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size_px:g}" text-anchor="{anchor}" '
            f'fill="{color}">{html.escape(content)}</text>')


def document(width: float, height: float, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{FONT}">'
            f'<rect width="100%" height="100%" fill="#fff"/>{"".join(body)}</svg>')
