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


def memory_law_png(result, width_in: float = 7.0) -> bytes:
    """Measured peaks against batch size, the fitted law, and the limit and budget lines."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    mib = 2**20
    fig = Figure(figsize=(width_in, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    real = [t for t in result.trials if not t.estimated]
    estimates = [t for t in result.trials if t.estimated and t.peak_bytes is not None]
    fits = [t for t in real if t.peak_bytes is not None and t.ok and t.peak_bytes <= result.limit_bytes]
    over = [t for t in real if t.peak_bytes is not None and t not in fits]
    failed = [t for t in real if t.peak_bytes is None]
    sizes = [t.batch_size for t in result.trials] or [1]
    x_max = max(sizes) * 1.05
    if result.per_sample_bytes is not None:
        ax.plot([0, x_max], [result.fixed_bytes / mib, (result.fixed_bytes + result.per_sample_bytes * x_max) / mib],
                color="#59636e", linewidth=1, label="fitted law")
    ax.axhline(result.limit_bytes / mib, color="#bf8700", linestyle="--", linewidth=1, label="limit (budget - margin)")
    ax.axhline(result.budget_bytes / mib, color="#d1242f", linestyle=":", linewidth=1, label="budget")
    ax.scatter([t.batch_size for t in fits], [t.peak_bytes / mib for t in fits], color="#1a7f37", zorder=3,
               label="ran, fits")
    if estimates:
        scale = result.calibration or 1.0
        ax.scatter([t.batch_size for t in estimates], [t.peak_bytes * scale / mib for t in estimates],
                   facecolors="none", edgecolors="#0969da", zorder=3,
                   label=f"fake-tensor estimate (x{scale:.2f})")
    if over:
        ax.scatter([t.batch_size for t in over], [t.peak_bytes / mib for t in over], color="#d1242f", marker="o",
                   zorder=3, label="ran, over the limit")
    if failed:
        ax.scatter([t.batch_size for t in failed], [result.budget_bytes / mib] * len(failed), color="#d1242f",
                   marker="x", zorder=3, label="out of memory")
    if result.batch_size is not None:
        ax.axvline(result.batch_size, color="#1a7f37", linewidth=0.8)
        ax.annotate(f"answer: {result.batch_size}", (result.batch_size, 0), xytext=(4, 4),
                    textcoords="offset points", fontsize=8, color="#1a7f37")
    ax.set_xlim(0, x_max)
    ax.set_ylim(0, result.budget_bytes / mib * 1.12)
    ax.set_xlabel("batch size")
    ax.set_ylabel("peak above start (MiB)")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


VERDICT_COLORS = {"faster": "#1a7f37", "slower": "#d1242f", "no clear difference": "#8c959f",
                  "baseline": "#59636e", "unknown": "#8c959f"}


def speedup_png(result, width_in: float = 7.0) -> bytes:
    """Each variant's speedup over eager with its 95% CI as whiskers; colour says whether the
    interval excludes 1 (green faster, red slower, grey no clear difference)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shown = [v for v in result.variants if v.speedup is not None]
    fig = Figure(figsize=(width_in, 0.45 * len(shown) + 1.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for y, v in enumerate(shown):
        color = VERDICT_COLORS[v.verdict]
        hatch = "//" if not v.trustworthy else None
        ax.barh(y, v.speedup, color=color, alpha=0.85, height=0.6, hatch=hatch, edgecolor="white")
        if v.ci:
            ax.errorbar(v.speedup, y, xerr=[[v.speedup - v.ci[0]], [v.ci[1] - v.speedup]], color="#1f2328",
                        capsize=3, linewidth=1)
        label = f"{v.speedup:.2f}×" + ("" if v.trustworthy else " (not trusted)")
        ax.annotate(label, (max(v.ci[1] if v.ci else v.speedup, v.speedup), y), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.axvline(1.0, color="#1f2328", linewidth=0.8, linestyle="--")
    ax.set_yticks(range(len(shown)), [v.name for v in shown])
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xlim(0, max(max((v.ci[1] if v.ci else v.speedup) for v in shown) * 1.2, 1.2))
    ax.set_xlabel("speedup over eager (higher is faster; whiskers: 95% CI)")
    ax.spines[["top", "right"]].set_visible(False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def loader_png(result, width_in: float = 7.0) -> bytes:
    """Batches per second per setting: each pass as a dot, the median as a bar; the current
    settings in grey, the best in green."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [r for r in result.rows if r.batches_per_s]
    fig = Figure(figsize=(width_in, 0.45 * len(rows) + 1.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for y, row in enumerate(rows):
        color = "#1a7f37" if row.settings == result.best else "#8c959f" if row.settings == result.current else "#0969da"
        ax.barh(y, row.median_batches_per_s, color=color, alpha=0.8, height=0.6)
        ax.scatter(row.batches_per_s, [y] * len(row.batches_per_s), color="#1f2328", s=8, zorder=3)
    ax.set_yticks(range(len(rows)), [r.settings.label() for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("batches per second, the loader alone (bars: median; dots: each pass)")
    ax.spines[["top", "right"]].set_visible(False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()
