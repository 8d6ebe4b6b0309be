"""Text, HTML and widget views of a :class:`CompareResult`, and its speedup chart.  The verdict comes first."""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING

from ...core.expectations import judge
from ...core.render.base import report_html, tabs_html
from ...core.render.format import fmt_bytes, fmt_s
from ...core.render.plot import figure_png, new_figure
from ...core.render.table import Column, Table

if TYPE_CHECKING:  # the result imports this view when it is shown, not the other way round
    from .result import CompareResult, VariantResult

VERDICT_COLORS = {"faster": "#1a7f37", "slower": "#d1242f", "no clear difference": "#8c959f",
                  "baseline": "#59636e", "unknown": "#8c959f"}


def headline(r: CompareResult) -> str:
    """The verdict, then each variant that failed and why (a table note alone was easy to miss)."""
    failed = [v.failure() for v in r.variants[1:] if not v.ok] if r.baseline.ok else []
    return "; ".join([_verdict(r).removesuffix("."), *failed]) if failed else _verdict(r)


def _verdict(r: CompareResult) -> str:
    base = r.baseline
    if not base.ok:
        return f"No comparison: eager failed ({base.error})."
    best = r.best
    if best is base:
        measured = [v for v in r.variants[1:] if v.ok]
        if not measured:
            return "No variant ran besides eager (see below)."
        return (f"{_named(base)} is fastest: no variant was faster with 95% confidence"
                + _others_summary(measured))
    low, high = best.ci
    versus = f"{speed_words(best.speedup)} than {base.dtype} {base.name}"
    parts = [f"{_named(best)}: {versus} (95% CI {low:.2f}–{high:.2f})"]
    if best.max_rel_err is not None:
        parts.append(f"max rel err {_fmt_err(best.max_rel_err)}")
    if best.compile_s is not None:
        parts.append(f"pays off after {best.break_even_runs:,} runs" if best.break_even_runs is not None
                     else f"one-time cost {fmt_s(best.compile_s)}")
    return ", ".join(parts)


def expectation_line(r: CompareResult) -> str | None:
    """With --expect, the answer to the finding this run verifies: is the speedup inside its prediction?"""
    expect = r.options.expect
    if expect is None or len(r.variants) < 2:
        return None
    v = r.variants[1]  # --expect takes exactly one variant besides eager
    if r.expectation_check is not None:
        return judge(_named(v), r.expectation_check)
    why = ("it was not compiled" if v.fell_back else "it failed") if not v.ok else "too few rounds"
    return f"Not judged against the {expect.text()} the finding predicted: {v.name} has no 95% CI ({why})."


def speed_words(speedup: float) -> str:
    """A speedup over the baseline in words, one way everywhere: 2.41 → "2.41× faster", and below 1
    the slowdown, 0.84 → "1.19× slower" (1 / 0.84), never "0.84× faster"."""
    return f"{speedup:.2f}× faster" if speedup >= 1 else f"{1 / speedup:.2f}× slower"


def _named(v: VariantResult) -> str:
    """A variant with what it computes in and where: "amp (bfloat16, cpu)"."""
    return f"{v.name} ({v.runs_as})"


def details(r: CompareResult) -> list[str]:
    blocks, of = ((f" in {r.blocks} blocks, each started afresh", "the blocks' median ratios") if r.blocks > 1
                  else ("", "them"))
    lines = [f"{r.rounds} interleaved rounds{blocks}, {fmt_s(r.seconds)} on "
             f"{r.device.name or r.device.kind}; medians per run; speedups are medians of per-round ratios, "
             f"CIs from the order statistics of {of}; errors against fp32 eager's output (relative to its "
             "largest value)"]
    lines += r.notes
    for v in r.variants:
        if v.error:
            lines.append(f"{v.name} {v.outcome}: {v.error}")
        lines += [f"{v.name}: {note}" for note in v.notes]
    return lines


def _table(r: CompareResult) -> Table:
    return Table([
        Column("variant", lambda v: v.name, "left"),
        Column("dtype, device", lambda v: v.runs_as, "left"),
        Column("median", lambda v: fmt_s(v.median_s)),
        Column("IQR", lambda v: fmt_s(v.iqr_s)),
        Column("speedup (95% CI)", _fmt_speedup),
        Column("compile", lambda v: fmt_s(v.compile_s), optional=True),
        Column("pays off after", _fmt_break_even, optional=True),
        Column("peak mem", lambda v: fmt_bytes(v.peak_bytes)),
        Column("graph pool", lambda v: fmt_bytes(v.graph_pool_bytes), optional=True),
        Column("max rel err", lambda v: _fmt_err(v.max_rel_err) + ("" if v.numerics_ok is not False else " ✗")),
        Column("notes", lambda v: v.outcome if not v.ok else ", ".join(v.flags()), "left", optional=True),
    ], r.variants, noun="variants")


def _fmt_speedup(v: VariantResult) -> str:
    if v.speedup is None:
        return "–"
    if v.ci is None:
        return f"{v.speedup:.2f}×"
    return f"{v.speedup:.2f}× ({v.ci[0]:.2f}–{v.ci[1]:.2f})"


def _fmt_break_even(v: VariantResult) -> str:
    if v.compile_s is None:
        return ""
    if v.break_even_runs is not None:
        return f"{v.break_even_runs:,} runs"
    return "never" if v.verdict == "slower" else "–"


def _fmt_err(err: float | None) -> str:
    if err is None:
        return "–"
    if err == 0:
        return "0"
    return "∞" if math.isinf(err) else f"{err:.1e}"


def _others_summary(measured: list[VariantResult]) -> str:
    """What became of each variant when none won: slower ones by how much, the rest as within noise
    (a headline that named only the slower ones said nothing of a variant whose interval holds 1)."""
    words = [f"{_named(v)} {speed_words(v.speedup)}" if v.verdict == "slower" else
             f"{_named(v)} within noise ({v.speedup:.2f}×, 95% CI {v.ci[0]:.2f}–{v.ci[1]:.2f})"
             for v in measured if v.verdict in ("slower", "no clear difference")]
    return "; " + ", ".join(words) if words else ""


# -- text ------------------------------------------------------------------------------
def text(r: CompareResult) -> str:
    expected = expectation_line(r)
    return "\n".join([headline(r), *([expected] if expected else []), "", _table(r).to_text(), "", *details(r)])


# -- HTML ------------------------------------------------------------------------------
def _summary_html(r: CompareResult) -> str:
    notes = "".join(f'<div class="tm-note">{escape(line)}</div>' for line in details(r))
    expected = expectation_line(r)
    return (f'<div class="tm-headline">{escape(headline(r))}</div>'
            + (f"<div>{escape(expected)}</div>" if expected else "")
            + f"{_table(r).to_html()}{notes}")


def html(r: CompareResult) -> str:
    pages: list[tuple[str, str | bytes]] = [("Verdict", _summary_html(r))]
    png = plot_png(r)
    if png:
        pages.append(("Chart", png))
    return report_html(tabs_html(pages))


# -- plot ------------------------------------------------------------------------------
def plot_png(r: CompareResult) -> bytes | None:
    if not any(v.ci for v in r.variants):
        return None
    return speedup_png(r)


def speedup_png(result: CompareResult, width_in: float = 7.0) -> bytes:
    """Each variant's speedup over eager with its 95% CI as whiskers; colour says whether the
    interval excludes 1 (green faster, red slower, grey no clear difference)."""
    shown = [v for v in result.variants if v.speedup is not None]
    fig = new_figure(width_in, 0.45 * len(shown) + 1.0)
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
    ax.set_yticks(range(len(shown)), [f"{v.name} ({v.dtype})" for v in shown])
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xlim(0, max(max((v.ci[1] if v.ci else v.speedup) for v in shown) * 1.2, 1.2))
    ax.set_xlabel("speedup over eager (higher is faster; whiskers: 95% CI)")
    ax.spines[["top", "right"]].set_visible(False)
    return figure_png(fig)
