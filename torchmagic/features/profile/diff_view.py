"""Text, HTML and widget views of a :class:`ProfileDiff`: the ratio first, then what moved."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from ...core.render.base import report_html, tabs_html
from ...core.render.format import fmt_s
from ...core.render.table import Column, Table

if TYPE_CHECKING:  # the result imports this view when it is shown, not the other way round
    from .diff import ProfileDiff

OPS_SHOWN = 15


def headline(d: ProfileDiff) -> str:
    """The ratio (the median of every after/before pair of step times) and its interval first; the
    verdict only where the interval settles it; the two medians after."""
    way = f"{d.speedup:.2f}x faster" if d.ratio < 1 else f"{d.ratio:.2f}x slower" if d.ratio > 1 else "unchanged"
    if d.ratio_ci is None:
        ci, verdict = "no interval: it needs 4 steps a side", f"{way} on this estimate"
    else:
        low, high = d.ratio_ci
        ci = f"{d.confidence:.0%} CI {low:.2f}–{high:.2f}"
        verdict = (way if high < 1 or low > 1 else
                   "no clear change: the interval includes 1.00 (profile more steps, or measure with %%amp_compare)")
    return (f"After / before: {d.ratio:.2f}x the step time ({ci}): {verdict}; median step "
            f"{fmt_s(d.step_before_s)} → {fmt_s(d.step_after_s)} ({d.steps[0]} and {d.steps[1]} steps)")


def _findings_lines(d: ProfileDiff) -> list[str]:
    lines = [f"  gone: {f.rule} ({f.title})" for f in d.findings_gone]
    lines += [f"  new:  {f.rule} ({f.title})" for f in d.findings_new]
    lines += [f"  kept: {a.rule}: {b.share:.0%} → {a.share:.0%} of the step" for b, a in d.findings_kept]
    return lines or ["  none, before or after"]


def _ops_table(d: ProfileDiff) -> Table:
    return Table([
        Column("operator", lambda o: o.name, "left"),
        Column("", lambda o: o.status, "left"),
        Column("before", lambda o: fmt_s(o.seconds_before)),
        Column("after", lambda o: fmt_s(o.seconds_after)),
        Column("change", lambda o: ("+" if o.change_s > 0 else "−") + fmt_s(abs(o.change_s))),
        Column("calls", lambda o: f"{o.calls_before:g} → {o.calls_after:g}"),
    ], d.ops, limit=OPS_SHOWN, noun="operators")


def _categories_table(d: ProfileDiff) -> Table:
    rows = sorted(d.categories.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))
    return Table([
        Column("category", lambda row: row[0], "left"),
        Column("before", lambda row: fmt_s(row[1][0])),
        Column("after", lambda row: fmt_s(row[1][1])),
        Column("change", lambda row: ("+" if row[1][1] > row[1][0] else "−") + fmt_s(abs(row[1][1] - row[1][0]))),
    ], rows, noun="categories")


def text(d: ProfileDiff) -> str:
    return "\n".join([
        headline(d), f"before: {d.before}; after: {d.after}", *d.notes, "", "Findings:", *_findings_lines(d), "",
        f"Operators by the change in their self {d.time_basis} time per step:", _ops_table(d).to_text(), "",
        "CPU time by category, per step:", _categories_table(d).to_text()])


def _summary_html(d: ProfileDiff) -> str:
    notes = "".join(f'<div class="tm-note">{escape(n)}</div>' for n in [f"before: {d.before}; after: {d.after}",
                                                                          *d.notes])
    findings = "".join(f"<div>{escape(line.strip())}</div>" for line in _findings_lines(d))
    return f'<div class="tm-headline">{escape(headline(d))}</div>{notes}<h4>Findings</h4>{findings}'


def _tables_html(d: ProfileDiff) -> str:
    return (f"<h4>Operators by the change in their self {d.time_basis} time per step</h4>{_ops_table(d).to_html()}"
            f"<h4>CPU time by category, per step</h4>{_categories_table(d).to_html()}")


def html(d: ProfileDiff) -> str:
    return report_html(tabs_html([("Summary", _summary_html(d)), ("Operators", _tables_html(d))]))
