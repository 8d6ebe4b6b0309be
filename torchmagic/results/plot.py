"""Matplotlib drawings, imported only when a picture is asked for (matplotlib costs ~0.3 s to import)."""

from __future__ import annotations

import io
from collections import defaultdict


def timeline_figure_png(spans, colors: dict[str, str], step_starts_us=(), width_in: float = 10.0) -> bytes:
    """Bars per lane (CPU thread, GPU streams) over time, coloured by category; dashed lines
    mark where each profiled step starts."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    lanes = sorted({s.lane for s in spans}, key=lambda lane: (lane != "CPU", lane))
    bars: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    t0 = min([s.start_us for s in spans] + list(step_starts_us))
    for s in spans:
        bars[(s.lane, s.category)].append(((s.start_us - t0) / 1e3, max(s.dur_us / 1e3, 1e-4)))
    fig = Figure(figsize=(width_in, 0.55 * len(lanes) + 1.1), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for (lane, category), ranges in bars.items():
        y = lanes.index(lane)
        ax.broken_barh(ranges, (y - 0.38, 0.76), facecolors=colors.get(category, "#888"), linewidth=0)
    for i, start in enumerate(step_starts_us):
        x = (start - t0) / 1e3
        ax.axvline(x, color="#59636e", linestyle="--", linewidth=0.8)
        if len(step_starts_us) <= 12:
            ax.annotate(f"step {i}", (x, len(lanes) - 0.5), xytext=(2, 2), textcoords="offset points",
                        fontsize=7, color="#59636e")
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlabel("time since the first profiled step (ms); gaps are Python or idle time")
    ax.spines[["top", "right"]].set_visible(False)
    used = [c for c in colors if any(cat == c for _, cat in bars)]
    ax.legend(handles=[Patch(color=colors[c], label=c) for c in used], loc="lower left",
              bbox_to_anchor=(0.0, 1.02), ncol=len(used), frameon=False, fontsize=8,
              handlelength=1.2, borderaxespad=0.0)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()
