"""Text, HTML and widget views of a :class:`TraceAnalysis`: the straggler first, a row per rank,
findings, and one step per rank drawn side by side."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from ....core.render.base import report_html, tabs_html
from ....core.render.format import fmt_bytes, fmt_s
from ....core.render.plot import figure_png, new_figure
from ....core.render.table import Column, Table
from ..view import findings_html, findings_lines, operator_lines, operators_html

if TYPE_CHECKING:  # the result imports this view when it is shown, not the other way round
    from .result import TraceAnalysis

LANE_COLORS = {"compute": "#0969da", "data loading": "#bf8700", "communication (exposed)": "#d1242f",
               "communication (overlapped)": "#f4a3a8"}


def headline(r: TraceAnalysis) -> str:
    if len(r.ranks) == 1:
        one = r.ranks[0]
        return (f"1 rank: {fmt_s(one.step_s)} per step, {fmt_s(one.comm_s)} of it in collectives "
                f"({fmt_s(one.exposed_comm_s)} exposed)")
    if r.straggler is not None:
        return f"Straggler: rank {r.straggler}. {r.straggler_reason[0].upper()}{r.straggler_reason[1:]}"
    waits = ", ".join(f"rank {x.rank} {fmt_s(x.wait_s)}" for x in r.ranks)
    return f"{len(r.ranks)} ranks, no straggler: they wait for each other about equally (per step: {waits})"


def details(r: TraceAnalysis) -> list[str]:
    job = ", ".join(part for part in (
        f"world size {r.world_size}" if r.world_size else "", f"backend {r.backend}" if r.backend else "",
        f"{r.events:,} events", fmt_bytes(r.bytes_read) + " read", f"analysed in {fmt_s(r.analysis_s)}") if part)
    return [f"{r.source}: {job}", *r.notes]


def _ranks_table(r: TraceAnalysis) -> Table:
    def ms(field):
        return lambda x: fmt_s(getattr(x, field))

    return Table([
        Column("rank", lambda x: f"{x.rank}" + ("  ← straggler" if x.rank == r.straggler else ""), "left"),
        Column("steps", lambda x: str(x.steps) if x.steps else "–"),
        Column("step", ms("step_s")),
        Column("compute", ms("compute_s")),
        Column("data loading", ms("dataloader_s")),
        Column("communication", ms("comm_s")),
        Column("exposed", ms("exposed_comm_s")),
        Column("waiting", ms("wait_s")),
        Column("transfer", ms("transfer_s")),
        Column("idle", ms("idle_s")),
    ], r.ranks, noun="ranks")


def _collectives_table(r: TraceAnalysis) -> Table | None:
    rows = [(x.rank, op, c) for x in r.ranks for op, c in sorted(x.collectives.items())]
    if not rows:
        return None
    return Table([
        Column("rank", lambda row: str(row[0]), "left"),
        Column("collective", lambda row: row[1], "left"),
        Column("calls/step", lambda row: f"{row[2]['calls'] / max(_steps(r, row[0]), 1):.3g}"),
        Column("time/step", lambda row: fmt_s(row[2]["seconds_per_step"])),
        Column("bytes", lambda row: fmt_bytes(row[2]["bytes"]) if row[2]["bytes"] else "–", optional=True),
    ], rows, limit=40, noun="collectives")


def _steps(r: TraceAnalysis, rank) -> int:
    return next((x.steps for x in r.ranks if x.rank == rank), 1) or 1


# -- text ------------------------------------------------------------------------------
def text(r: TraceAnalysis) -> str:
    out = [headline(r), *details(r), "", "Per rank, seconds per step:", _ranks_table(r).to_text()]
    if r.findings:
        out += ["", *findings_lines(r.findings)]
    collectives = _collectives_table(r)
    if collectives:
        out += ["", "Collectives by op (time executing, waits included):", collectives.to_text()]
    if r.profile is not None:
        out += ["", f"{_operators_title(r)}:", *r.profile.notes, *operator_lines(r.profile)]
    return "\n".join(out)


def _operators_title(r: TraceAnalysis) -> str:
    return f"Operators of {r.profile.label}, as %%torchprofile reports them"


def _operators_html(r: TraceAnalysis) -> str:
    if r.profile is None:
        return ""
    notes = "".join(f'<div class="tm-note">{escape(line)}</div>' for line in r.profile.notes)
    return f"<h3>{escape(_operators_title(r))}</h3>{notes}{operators_html(r.profile)}"


# -- HTML ------------------------------------------------------------------------------
def _body_html(r: TraceAnalysis) -> str:
    notes = "".join(f'<div class="tm-note">{escape(line)}</div>' for line in details(r))
    findings = findings_html(r.findings) if r.findings else ""
    return (f'<div class="tm-headline">{escape(headline(r))}</div>{notes}'
            f"<h4>Per rank, seconds per step</h4>{_ranks_table(r).to_html()}{findings}")


def _collectives_html(r: TraceAnalysis) -> str:
    table = _collectives_table(r)
    return f"<h4>Collectives by op</h4>{table.to_html()}" if table else ""


def html(r: TraceAnalysis) -> str:
    pages: list[tuple[str, str | bytes]] = [("Ranks", _body_html(r))]
    png = plot_png(r)
    if png:
        pages.append(("Timeline", png))
    if _collectives_table(r):
        pages.append(("Collectives", _collectives_html(r)))
    if r.profile is not None:
        pages.append(("Operators", _operators_html(r)))
    return report_html(tabs_html(pages))


# -- plot ------------------------------------------------------------------------------
def plot_png(r: TraceAnalysis) -> bytes | None:
    if not r.lanes:
        return None
    return lanes_png(r)


def lanes_png(r: TraceAnalysis, width_in: float = 10.0) -> bytes:
    """One lane per rank: the same step on each, from its own start, by kind of time."""
    from matplotlib.patches import Patch

    fig = new_figure(width_in, 0.5 * len(r.lanes) + 1.2)
    ax = fig.add_subplot()
    for y, lane in enumerate(r.lanes):
        for kind, spans in lane.spans.items():
            height = 0.36 if kind == "communication (overlapped)" else 0.76
            ax.broken_barh([(s * 1e3, max(d * 1e3, 1e-3)) for s, d in spans], (y - height / 2, height),
                           facecolors=LANE_COLORS[kind], linewidth=0)
        ax.plot([lane.step_s * 1e3] * 2, [y - 0.42, y + 0.42], color="#1f2328", linewidth=1)
    ax.set_yticks(range(len(r.lanes)), [f"rank {lane.rank}" + (" (straggler)" if lane.rank == r.straggler else "")
                                        for lane in r.lanes])
    ax.set_ylim(len(r.lanes) - 0.5, -0.5)
    step = f"step {r.lane_step}" if r.lane_step is not None else "the trace"
    ax.set_xlabel(f"ms since the start of {step} on each rank; gaps are idle (or Python between ops); "
                  "| marks the step's end")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in LANE_COLORS.items()], loc="lower left",
              bbox_to_anchor=(0.0, 1.02), ncol=len(LANE_COLORS), frameon=False, fontsize=8,
              handlelength=1.2, borderaxespad=0.0)
    return figure_png(fig)
