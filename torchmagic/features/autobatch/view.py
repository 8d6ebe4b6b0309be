"""Text, HTML and widget views of an :class:`AutobatchResult`, and its memory-law plot.  The answer comes first."""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING

from ...core.render.base import report_html, tabs_html
from ...core.render.format import fmt_bytes, fmt_s
from ...core.render.plot import figure_png, new_figure
from ...core.render.table import Column, Table
from .search import TRIAL_STEPS

if TYPE_CHECKING:  # the result imports this view when it is shown, not the other way round
    from .result import AutobatchResult


def headline(r: AutobatchResult) -> str:
    if r.leak is not None:
        return _leak_headline(r)
    if r.batch_size is None:
        return f"No batch size fits: {r.reason}."
    trial = r.answer_trial
    size = bytes_format(r)
    peak = f", peaked at {size(trial.peak_bytes)}" if trial and trial.peak_bytes is not None else ""
    if r.ranks > 1:
        where = _largest_rank(trial)
        return (f"Largest batch size that fits: {r.batch_size} per rank × {r.ranks} ranks = global batch "
                f"{r.global_batch_size} (ran on every rank{peak}{where}; limit per rank "
                f"{size(r.limit_bytes)} = budget {size(r.budget_bytes)} less {r.options.margin:.0%} margin)")
    return (f"Largest batch size that fits: {r.batch_size} (ran{peak}; limit "
            f"{size(r.limit_bytes)} = budget {size(r.budget_bytes)} less "
            f"{r.options.margin:.0%} margin)")


def _leak_headline(r: AutobatchResult) -> str:
    leak = r.leak
    return (f"Memory leak: at batch {leak.batch_size} the memory the step holds grew by "
            f"{fmt_bytes(leak.per_call_bytes)} after every call ({fmt_bytes(leak.per_sample_bytes)} per sample), "
            "so the search stopped there; "
            + (f"largest size verified until then: {r.batch_size}, for the first steps only"
               if r.batch_size is not None else "no size was verified before it"))


def _leak_lines(r: AutobatchResult) -> list[str]:
    """Where the leak was seen, what the figures past it are worth, what the answer still means, and where to look."""
    leak = r.leak
    lines = [f"Leak: {leak.runs} runs of {TRIAL_STEPS} steps at batch {leak.batch_size}, each from your model's and "
             f"optimizer's state put back and memory released, each left {fmt_bytes(leak.per_call_bytes * TRIAL_STEPS)} "
             "more held, in references your step keeps (torchmagic released its own and left yours untouched). "
             "Trials past it would start from less and less free memory: their figures would not be trustworthy."]
    trial = r.answer_trial
    if trial is not None and trial.peak_bytes is not None:
        per_step = leak.per_sample_bytes * r.batch_size
        steps = max(r.limit_bytes - trial.peak_bytes, 0) / per_step
        lines.append(f"Batch {r.batch_size} is the largest size verified before the leak stopped the search, "
                     f"not a size that stays within the budget: at {fmt_bytes(per_step)} more per step it passes "
                     f"the limit after about {steps:,.0f} steps, at any size sooner or later.")
    lines.append("Look for a reference kept from one call to the next: a list or dict the step appends tensors to, "
                 "a global or attribute it assigns, `loss` kept without .item() or .detach() (its graph holds the "
                 "activations), a hook that stores outputs. Fix it and run %autobatch again.")
    return lines


def _largest_rank(trial) -> str:
    peaks = trial.rank_peaks_bytes if trial is not None else None
    return f" on rank {peaks.index(max(peaks))}" if peaks else ""


def bytes_format(r: AutobatchResult) -> Callable[[float | None], str]:
    """How the report writes the trials' peaks and the limit: one decimal, or as many more as it
    takes for every peak to read on its own side of the limit (a size that fits never prints
    above the limit, one over it never at or below it, so the two never print the same figure),
    else exact bytes."""
    real = [t.peak_bytes for t in r.trials if not t.estimated and t.peak_bytes is not None]
    for decimals in range(1, 7):
        limit = _rounded(r.limit_bytes, decimals)[0]
        if all((_rounded(peak, decimals)[0] <= limit) == (peak <= r.limit_bytes) for peak in real):
            return lambda n, d=decimals: "–" if n is None else _rounded(n, d)[1]
    return lambda n: "–" if n is None else f"{n:,.0f} B"


def _rounded(n: float, decimals: int) -> tuple[float, str]:
    """``n`` bytes in the unit fmt_bytes picks, to ``decimals`` places (fmt_bytes's own text at
    one): the value shown, in bytes, and its text."""
    scale, unit = 1, "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 * scale or unit == "TiB":
            break
        scale *= 1024
    if unit == "B":
        return round(n), f"{n:.0f} B"
    value = round(n / scale, decimals)
    return value * scale, f"{value:.{decimals}f} {unit}"


def details(r: AutobatchResult) -> list[str]:
    lines = [f"Why: {r.reason}. Budget: {r.budget_source}."]
    if r.leak is not None:
        lines += _leak_lines(r)
    if r.per_sample_bytes is not None:
        lines.append(f"Memory law: {fmt_bytes(max(r.fixed_bytes, 0))} fixed + "
                     f"{fmt_bytes(r.per_sample_bytes)} per sample, fitted on the runs")
    real = sum(not t.estimated for t in r.trials)
    estimated = len(r.trials) - real
    how = f"{estimated} fake-tensor estimates and " if r.prediction else ""
    lines += _prediction(r)
    lines.append(f"{how}{real} real trial{'s' if real != 1 else ''} in {fmt_s(r.seconds)} on "
                 f"{r.device.name or r.device.kind}, each {TRIAL_STEPS} steps from your model's and "
                 "optimizer's state")
    target = r.options.target_batch
    if r.accumulation_steps == 1:
        lines.append(f"Batch {target} fits in one step: no gradient accumulation needed")
    elif r.accumulation_steps:
        per_rank = f" on each of {r.ranks} ranks" if r.ranks > 1 else ""
        effective = r.accumulation_steps * r.micro_batch * r.ranks
        lines.append(f"Batch {target}: {r.accumulation_steps} accumulation steps of {r.micro_batch}{per_rank}"
                     + (f" (effective {effective})" if effective != target else ""))
    if r.throughput:
        best = max(r.throughput, key=lambda p: p.samples_per_s)
        over = f" over the {r.ranks} ranks" if r.ranks > 1 else ""
        lines.append(f"Throughput: best {best.samples_per_s:,.0f} samples/s{over} at batch {best.batch_size}; "
                     f"batch {r.knee_batch_size} is within 5% of it (the knee)")
    lines += r.notes
    if r.memory_before_bytes is not None and r.memory_after_bytes is not None:
        lines.append(f"Memory in use before the search {fmt_bytes(r.memory_before_bytes)}, "
                     f"after {fmt_bytes(r.memory_after_bytes)}")
    return lines


def _prediction(r: AutobatchResult) -> list[str]:
    """What the estimates predicted for the first size verified, what that rested on, what its run read."""
    p = r.prediction
    if p is None or p.batch_size is None:
        return []
    scaled = f"torch's allocations taken as {p.calibration:.2f}x the fake-tensor estimate"
    if p.share != 1.0:
        scaled += (f", the process's resident memory as {p.share:.2f}x those allocations "
                   f"+ {fmt_bytes(p.fixed_bytes)}")
    rested = f"{scaled}, read in a real run at batch {p.read_at}"
    if p.measured_bytes is None:
        read = "its run ran out of memory"
    elif p.peak_bytes:
        read = f"its run read {fmt_bytes(p.measured_bytes)} ({p.measured_bytes / p.peak_bytes - 1:+.0%})"
    else:
        read = f"its run read {fmt_bytes(p.measured_bytes)}"
    return [f"Predicted: batch {p.batch_size} at {fmt_bytes(p.peak_bytes or 0)} ({rested}); {read}"]


def _trials_table(r: AutobatchResult) -> Table:
    size = bytes_format(r)
    fresh = r.options.fresh  # each read in a process of its own
    return Table([
        Column("batch", lambda t: str(t.batch_size)),
        Column("peak", lambda t: size(t.peak_bytes)),
        *([Column("torch's share", lambda t: size(t.allocated_bytes) if t.allocated_bytes is not None else "")]
          if any(t.allocated_bytes not in (None, t.peak_bytes) for t in r.trials) else []),
        *([Column("ranks' peaks", lambda t: _rank_range(t, size))] if r.ranks > 1 else []),
        *([Column("resident reads", lambda t: _reads_range(t, size, fresh))]
          if any(t.footprint_reads for t in r.trials) else []),
        Column("result", _outcome, "left"),
        Column("time", lambda t: fmt_s(t.seconds)),
    ], r.trials, noun="trials")


def _outcome(trial) -> str:
    shown = ("estimate" if trial.estimated else "fits" if trial.ok else
             "over the limit" if trial.ran else "out of memory")
    return f"{shown}; memory held grew: leak" if trial.leaked else shown


def _rank_range(trial, size) -> str:
    """The least and the largest of the ranks' peaks: how far apart the ranks are."""
    return _span(trial.rank_peaks_bytes, size)


def _reads_range(trial, size, fresh: bool) -> str:
    """The least and the most of a trial's footprint reads (its peak counts at least the most)."""
    reads = trial.footprint_reads
    return f"{_span(reads, size)} ({len(reads)} {'processes' if fresh else 'runs'})" if reads else ""


def _span(values, size) -> str:
    return f"{size(min(values))} – {size(max(values))}" if values else ""


def _throughput_table(r: AutobatchResult) -> Table:
    return Table([
        Column("batch", lambda p: str(p.batch_size)),
        Column("samples/s", lambda p: f"{p.samples_per_s:,.0f}"),
        Column("step", lambda p: fmt_s(p.seconds_per_step)),
    ], r.throughput, noun="sizes")


# -- text ------------------------------------------------------------------------------
def text(r: AutobatchResult) -> str:
    lines = [headline(r), *details(r), "", "Trials, in the order run:", _trials_table(r).to_text()]
    if r.throughput:
        lines += ["", "Throughput (un-profiled, median of 3 steps):", _throughput_table(r).to_text()]
    return "\n".join(lines)


# -- HTML ------------------------------------------------------------------------------
def _summary_html(r: AutobatchResult) -> str:
    notes = "".join(f'<div class="tm-note">{escape(line)}</div>' for line in details(r))
    return f'<div class="tm-headline">{escape(headline(r))}</div>{notes}'


def _tables_html(r: AutobatchResult) -> str:
    out = f"<h4>Trials, in the order run</h4>{_trials_table(r).to_html()}"
    if r.throughput:
        out += f"<h4>Throughput (un-profiled, median of 3 steps)</h4>{_throughput_table(r).to_html()}"
    return out


def html(r: AutobatchResult) -> str:
    pages: list[tuple[str, str | bytes]] = [("Answer", _summary_html(r))]
    png = plot_png(r)
    if png:
        pages.append(("Memory law", png))
    pages.append(("Trials", _tables_html(r)))
    return report_html(tabs_html(pages))


# -- plot ------------------------------------------------------------------------------
def plot_png(r: AutobatchResult) -> bytes | None:
    if not any(t.peak_bytes is not None for t in r.trials):
        return None
    return memory_law_png(r)


def memory_law_png(result: AutobatchResult, width_in: float = 7.0) -> bytes:
    """Measured peaks against batch size, the fitted law, and the limit and budget lines."""
    return figure_png(memory_law_figure(result, width_in))


def memory_law_figure(result: AutobatchResult, width_in: float = 7.0):
    """The memory-law plot's figure.  The answer's trial is drawn last, on top: the first size over
    the limit is often its neighbour, at nearly the same place.  The y axis reaches every trial
    drawn and the budget line."""
    mib = 2**20
    fig = new_figure(width_in, 3.6)
    ax = fig.add_subplot()
    real = [t for t in result.trials if not t.estimated]
    estimates = [t for t in result.trials if t.estimated and t.peak_bytes is not None]
    answer = result.answer_trial
    fits = [t for t in real if t.ok and t is not answer]
    over = [t for t in real if t.ran and not t.ok]
    failed = [t for t in real if not t.ran]
    scale = result.calibration or 1.0
    sizes = [t.batch_size for t in result.trials] or [1]
    x_max = max(sizes) * 1.05
    if result.per_sample_bytes is not None:
        ax.plot([0, x_max], [result.fixed_bytes / mib, (result.fixed_bytes + result.per_sample_bytes * x_max) / mib],
                color="#59636e", linewidth=1, label="fitted law")
    ax.axhline(result.limit_bytes / mib, color="#bf8700", linestyle="--", linewidth=1, label="limit (budget - margin)")
    ax.axhline(result.budget_bytes / mib, color="#d1242f", linestyle=":", linewidth=1, label="budget")
    if fits:
        ax.scatter([t.batch_size for t in fits], [t.peak_bytes / mib for t in fits], color="#1a7f37", zorder=3,
                   label="ran, fits")
    if estimates:
        ax.scatter([t.batch_size for t in estimates], [t.peak_bytes * scale / mib for t in estimates],
                   facecolors="none", edgecolors="#0969da", zorder=3,
                   label=f"fake-tensor estimate (x{scale:.2f})")
    if over:
        ax.scatter([t.batch_size for t in over], [t.peak_bytes / mib for t in over], color="#d1242f", marker="o",
                   zorder=3, label="ran, over the limit")
    if failed:
        ax.scatter([t.batch_size for t in failed], [result.budget_bytes / mib] * len(failed), color="#d1242f",
                   marker="x", zorder=3, label="out of memory")
    if answer is not None:
        ax.scatter([answer.batch_size], [answer.peak_bytes / mib], color="#1a7f37", edgecolors="#1f2328",
                   s=64, linewidths=1.2, zorder=ANSWER_ZORDER, label=f"answer: {answer.batch_size}")
    if result.batch_size is not None:
        ax.axvline(result.batch_size, color="#1a7f37", linewidth=0.8)
        ax.annotate(f"answer: {result.batch_size}", (result.batch_size, 0), xytext=(4, 4),
                    textcoords="offset points", fontsize=8, color="#1a7f37")
    peaks = ([t.peak_bytes for t in real if t.peak_bytes is not None]
             + [t.peak_bytes * scale for t in estimates])
    ax.set_xlim(0, x_max)
    ax.set_ylim(0, max([result.budget_bytes, *peaks]) / mib * 1.12)
    ax.set_xlabel("batch size")
    ax.set_ylabel("peak above start (MiB)")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


ANSWER_ZORDER = 5  # above every other trial's dot (3)
