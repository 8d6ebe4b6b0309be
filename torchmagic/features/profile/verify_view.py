"""Text and HTML views of a :class:`VerifyResult`: the measured speedup with its interval, and last the verdict."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from ...core.expectations import judge
from ...core.render.base import report_html
from ...core.render.format import fmt_s

if TYPE_CHECKING:  # the result imports this view when it is shown, not the other way round
    from .verify_result import VerifyResult


def headline(r: VerifyResult) -> str:
    ci = (f"95% CI {r.ci[0]:.2f}-{r.ci[1]:.2f}x" if r.ci is not None
          else f"no interval: it needs 6 blocks of rounds, these had {r.blocks}")
    return (f"Verify: {r.after} against {r.before}: speedup {r.speedup:.2f}x ({ci}) from {r.rounds} interleaved rounds "
            f"in {r.blocks} blocks; median run {fmt_s(r.before_s)} → {fmt_s(r.after_s)}")


def verdict_line(r: VerifyResult) -> str:
    """The last line: the verdict against the prediction, with the figures it rests on."""
    judged = r.verdict
    if judged is None:
        return "No verdict: no prediction to judge against (--expect LOW-HIGH, the finding's range, gives one)."
    if r.ci is None:
        return f"Verdict: inconclusive — {judged.reason}."
    return f"Verdict: {judged.outcome} — {judge('the fix', r.expectation_check)}"


def text(r: VerifyResult) -> str:
    return "\n".join([headline(r), *r.notes, verdict_line(r)])


def html(r: VerifyResult) -> str:
    notes = "".join(f'<div class="tm-note">{escape(n)}</div>' for n in r.notes)
    return report_html(f'<div class="tm-headline">{escape(headline(r))}</div>{notes}'
                       f'<div><b>{escape(verdict_line(r))}</b></div>')
