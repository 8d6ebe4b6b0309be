"""Text, HTML and widget views of a :class:`LoaderTuneResult`, and its throughput chart.  The answer
and the DataLoader line to copy come first."""

from __future__ import annotations

from dataclasses import replace
from html import escape
from typing import TYPE_CHECKING

from ...core.expectations import judge
from ...core.render.base import report_html, tabs_html
from ...core.render.format import fmt_s
from ...core.render.plot import figure_png, new_figure
from ...core.render.table import Column, Table

if TYPE_CHECKING:  # the result imports this view when it is shown, not the other way round
    from .result import LoaderTuneResult


def headline(r: LoaderTuneResult) -> str:
    """The answer, in words the table bears out: "fastest" names r.fastest only, the highest
    "× current" above 1, or the current settings when no setting measured faster than them.
    The recommendation follows run.recommend: the fastest of the settings surely (95%) faster
    than the current ones, or a simpler one that it is not surely faster than."""
    if r.stopped is not None:  # a partial sweep recommends nothing: its rounds are not paired
        return r.stopped
    ci = _fmt_ci(r.ci, " (95% CI {})")
    if r.best == r.current:
        if r.fastest == r.current:
            return f"Keep the current settings ({r.current.label()}): they fed batches fastest"
        return (f"Keep the current settings ({r.current.label()}): no setting fed batches faster with 95% "
                f"confidence (the fastest measured, {r.fastest.label()}, {_measured(r, r.speedup, ci)})")
    change = ", ".join(f"{k}={v!r}" for k, v in r.changes.items())
    failing = r.row(r.current)
    if failing is not None and failing.error is not None:
        return f"Set {change}: the current settings ({r.current.label()}) fail (below)"
    line = f"Set {change}: {r.speedup:.2f}× the batches/s{ci} of the current settings ({r.current.label()})"
    top = r.row(r.fastest)
    if r.fastest == r.best or top is None:
        return line
    measured = _measured(r, top.speedup, _fmt_ci(top.ci, " (95% CI {})"))
    if top.ci is not None and top.ci[0] > 1:  # surely faster than the current ones, not than this simpler one
        return f"{line}; {r.fastest.label()} measured faster, {measured}, but within noise of this simpler setting"
    return f"{line}; {r.fastest.label()} measured faster, {measured}, but within noise of the current settings"


def expectation_line(r: LoaderTuneResult) -> str | None:
    """With --expect, the answer to the finding this run verifies: is the change's speedup inside its prediction?"""
    expect = r.options.expect
    if expect is None:
        return None
    if r.expectation_check is not None:
        return judge(r.change.settings.label(), r.expectation_check)
    return (f"Not judged against the {expect.text()} the finding predicted: no other setting has a 95% CI of its "
            "speedup over the current ones (failed, or too few rounds).")


def _measured(r: LoaderTuneResult, speedup: float | None, ci: str) -> str:
    """The table's fastest against the current settings: the paired speedup, else both medians."""
    if speedup is not None:
        return f"{speedup:.2f}×{ci}"
    top, now = r.row(r.fastest), r.row(r.current)
    return (f"{_fmt_rate(top.median_batches_per_s if top else None)} batches/s against "
            f"{_fmt_rate(now.median_batches_per_s if now else None)}")


def _fmt_ci(ci: tuple[float, float] | None, template: str = "{}") -> str:
    return template.format(f"{ci[0]:.2f}–{ci[1]:.2f}") if ci else ""


def details(r: LoaderTuneResult) -> list[str]:
    lines = [f"copy: {r.loader_call}"]
    lines.append(f"{len(r.rows)} settings, {r.options.rounds} interleaved passes each, on "
                 f"{r.cpus} CPU cores in {fmt_s(r.seconds)}; workers start with {r.start_method!r}; "
                 "batches/s is the loader alone, after its first batch")
    if r.step_s is not None:
        loader_s = 1 / r.row(r.best).median_batches_per_s if r.row(r.best) and \
            r.row(r.best).median_batches_per_s else None
        bound = ("the model (the loader keeps up)" if loader_s is not None and r.step_s >= loader_s
                 else "the loader")
        lines.append(f"the training step alone takes {fmt_s(r.step_s)} a batch; with the current loader "
                     f"{r.with_step.get('current', 0):,.1f} steps/s, with the recommended "
                     f"{r.with_step.get('best', 0):,.1f} steps/s: the bottleneck is {bound}")
    best = r.best
    if best.persistent_workers and not r.current.persistent_workers:
        fresh, kept = r.row(replace(best, persistent_workers=False)), r.row(best)
        if fresh and kept and fresh.median_batches_per_s and kept.median_batches_per_s:
            lines.append(f"persistent_workers=True keeps the workers between epochs: {_fmt_rate(kept.median_batches_per_s)} "
                         f"batches/s with it, {_fmt_rate(fresh.median_batches_per_s)} without (new epochs' starts included)")
    if best.num_workers > 0 and best.num_workers >= r.cpus:
        lines.append("as many workers as cores: torch's own threads compete with them; on a CPU-only machine "
                     "try torch.set_num_threads(1) in the training process")
    lines += r.notes
    return lines


def _table(r: LoaderTuneResult) -> Table:
    return Table([
        Column("settings", lambda row: row.settings.label() + ("  (current)" if row.settings == r.current else "")
               + ("  ← recommended" if row.settings == r.best and r.best != r.current else ""), "left"),
        Column("batches/s", lambda row: _fmt_rate(row.median_batches_per_s)),
        Column("× current (95% CI)", lambda row: "" if row.speedup is None else
               f"{row.speedup:.2f}×" + _fmt_ci(row.ci, " ({})"), optional=True),
        Column("first batch", lambda row: fmt_s(row.median_first_batch_s)),
        Column("result", lambda row: row.error or "", "left", optional=True),
    ], r.rows, noun="settings")


def _fmt_rate(per_s: float | None) -> str:
    """Three significant figures at least, no false precision: 8,078 / 59.2 / 0.41."""
    if not per_s:
        return "–"
    return f"{per_s:,.0f}" if per_s >= 100 else f"{per_s:.3g}"


# -- text ------------------------------------------------------------------------------
def text(r: LoaderTuneResult) -> str:
    # wide enough for the longest settings and their mark: num_workers=16, prefetch_factor=4,
    # persistent_workers, pin_memory  ← recommended
    expected = expectation_line(r)
    return "\n".join([headline(r), *([expected] if expected else []), *details(r), "",
                      _table(r).to_text(max_name=84)])


# -- HTML ------------------------------------------------------------------------------
def _body_html(r: LoaderTuneResult) -> str:
    notes = "".join(f'<div class="tm-note">{escape(line)}</div>' for line in details(r)[1:])
    expected = expectation_line(r)
    return (f'<div class="tm-headline">{escape(headline(r))}</div>'
            + (f"<div>{escape(expected)}</div>" if expected else "")
            + f"<pre>{escape(r.loader_call)}</pre>{notes}{_table(r).to_html()}")


def html(r: LoaderTuneResult) -> str:
    pages: list[tuple[str, str | bytes]] = [("Answer", _body_html(r))]
    png = plot_png(r)
    if png:
        pages.append(("Chart", png))
    return report_html(tabs_html(pages))


# -- plot ------------------------------------------------------------------------------
def plot_png(r: LoaderTuneResult) -> bytes | None:
    if not any(row.batches_per_s for row in r.rows):
        return None
    return loader_png(r)


def loader_png(result: LoaderTuneResult, width_in: float = 7.0) -> bytes:
    """Batches per second per setting: each pass as a dot, the median as a bar; the current
    settings in grey, the best in green."""
    rows = [r for r in result.rows if r.batches_per_s]
    fig = new_figure(width_in, 0.45 * len(rows) + 1.0)
    ax = fig.add_subplot()
    for y, row in enumerate(rows):
        color = "#1a7f37" if row.settings == result.best else "#8c959f" if row.settings == result.current else "#0969da"
        ax.barh(y, row.median_batches_per_s, color=color, alpha=0.8, height=0.6)
        ax.scatter(row.batches_per_s, [y] * len(row.batches_per_s), color="#1f2328", s=8, zorder=3)
    ax.set_yticks(range(len(rows)), [r.settings.label() for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("batches per second, the loader alone (bars: median; dots: each pass)")
    ax.spines[["top", "right"]].set_visible(False)
    return figure_png(fig)
