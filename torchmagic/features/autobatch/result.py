"""The result of ``torchmagic.autobatch``: the verified batch size, the memory law, the trials."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.render.base import Result, png_img, report_html, tabbed
from ...core.render.format import fmt_bytes, fmt_s
from ...core.render.table import Column, Table


@dataclass(frozen=True)
class Trial:
    batch_size: int
    peak_bytes: int | None      # peak above the start of the run; None when it ran out of memory
    ok: bool
    seconds: float
    estimated: bool = False     # a fake-tensor estimate, not a run
    error: str | None = None
    samples_per_s: float | None = None


KNEE_TOLERANCE = 0.05  # the knee: the smallest size within 5% of the best samples/s


@dataclass(frozen=True)
class ThroughputPoint:
    batch_size: int
    samples_per_s: float
    seconds_per_step: float


@dataclass
class AutobatchResult(Result):
    """Bytes are what a step adds on top of the memory in use when the search started."""

    label: str
    device: dict[str, Any]
    batch_size: int | None            # the largest size that ran under the limit (never untested)
    budget_bytes: int
    limit_bytes: int                  # budget less the margin: what a trial's peak must stay under
    budget_source: str
    fixed_bytes: float | None         # the fitted law: peak(bs) = fixed + per_sample * bs
    per_sample_bytes: float | None
    trials: list[Trial] = field(default_factory=list)
    accumulation_steps: int | None = None
    micro_batch: int | None = None    # with accumulation: the even split of the target batch
    reason: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    memory_before_bytes: int | None = None
    memory_after_bytes: int | None = None
    throughput: list[ThroughputPoint] = field(default_factory=list)
    calibration: float | None = None  # real / fake-tensor peak at the smallest size, when estimated
    notes: list[str] = field(default_factory=list)

    @property
    def knee_batch_size(self) -> int | None:
        """The smallest measured size within 5% of the best samples/s: past it, a bigger batch
        buys memory pressure, not speed."""
        if not self.throughput:
            return None
        best = max(p.samples_per_s for p in self.throughput)
        return min(p.batch_size for p in self.throughput if p.samples_per_s >= (1 - KNEE_TOLERANCE) * best)

    @property
    def answer_trial(self) -> Trial | None:
        return next((t for t in reversed(self.trials)
                     if t.batch_size == self.batch_size and t.ok and not t.estimated), None)

    def headline(self) -> str:
        if self.batch_size is None:
            return f"No batch size fits: {self.reason}."
        trial = self.answer_trial
        peak = f", peaked at {fmt_bytes(trial.peak_bytes)}" if trial and trial.peak_bytes is not None else ""
        return (f"Largest batch size that fits: {self.batch_size} (ran{peak}; limit "
                f"{fmt_bytes(self.limit_bytes)} = budget {fmt_bytes(self.budget_bytes)} less "
                f"{self.options.get('margin', 0):.0%} margin)")

    def details(self) -> list[str]:
        lines = [f"Why: {self.reason}. Budget: {self.budget_source}."]
        if self.per_sample_bytes is not None:
            lines.append(f"Memory law: {fmt_bytes(max(self.fixed_bytes, 0))} fixed + "
                         f"{fmt_bytes(self.per_sample_bytes)} per sample, fitted on the runs")
        real = sum(not t.estimated for t in self.trials)
        estimated = len(self.trials) - real
        how = (f"{estimated} fake-tensor estimates (scaled by {self.calibration:.2f} to match a real run) and "
               if self.calibration else "")
        lines.append(f"{how}{real} real trial{'s' if real != 1 else ''} in {fmt_s(self.seconds)} on "
                     f"{self.device.get('name', self.device.get('kind'))}, after one warm-up step")
        target = self.options.get("target_batch")
        if self.accumulation_steps == 1:
            lines.append(f"Batch {target} fits in one step: no gradient accumulation needed")
        elif self.accumulation_steps:
            lines.append(f"Batch {target}: {self.accumulation_steps} accumulation steps of {self.micro_batch}"
                         + (f" (effective {self.accumulation_steps * self.micro_batch})"
                            if self.accumulation_steps * self.micro_batch != target else ""))
        if self.throughput:
            best = max(self.throughput, key=lambda p: p.samples_per_s)
            lines.append(f"Throughput: best {best.samples_per_s:,.0f} samples/s at batch {best.batch_size}; "
                         f"batch {self.knee_batch_size} is within 5% of it (the knee)")
        lines += self.notes
        if self.memory_before_bytes is not None and self.memory_after_bytes is not None:
            lines.append(f"Memory in use before the search {fmt_bytes(self.memory_before_bytes)}, "
                         f"after {fmt_bytes(self.memory_after_bytes)}")
        return lines

    def _trials_table(self) -> Table:
        return Table([
            Column("batch", lambda t: str(t.batch_size)),
            Column("peak", lambda t: fmt_bytes(t.peak_bytes) if t.peak_bytes is not None else "–"),
            Column("result", lambda t: ("estimate" if t.estimated else "fits" if t.ok and t.peak_bytes is not None
                                        and t.peak_bytes <= self.limit_bytes else
                                        "over the limit" if t.ok else "out of memory"), "left"),
            Column("time", lambda t: fmt_s(t.seconds)),
        ], self.trials, noun="trials")

    def _throughput_table(self) -> Table:
        return Table([
            Column("batch", lambda p: str(p.batch_size)),
            Column("samples/s", lambda p: f"{p.samples_per_s:,.0f}"),
            Column("step", lambda p: fmt_s(p.seconds_per_step)),
        ], self.throughput, noun="sizes")

    def interrupted_line(self) -> str:
        return self.reason or "interrupted: the trials that ran are below"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["answer_trial"] = asdict(self.answer_trial) if self.answer_trial else None
        data["knee_batch_size"] = self.knee_batch_size
        return data

    def to_text(self) -> str:
        lines = [self.headline(), *self.details(), "", "Trials, in the order run:", self._trials_table().to_text()]
        if self.throughput:
            lines += ["", "Throughput (un-profiled, median of 3 steps):", self._throughput_table().to_text()]
        return "\n".join(lines)

    def _summary_html(self) -> str:
        details = "".join(f'<div class="tm-note">{html.escape(line)}</div>' for line in self.details())
        return f'<div class="tm-headline">{html.escape(self.headline())}</div>{details}'

    def _tables_html(self) -> str:
        out = f"<h4>Trials, in the order run</h4>{self._trials_table().to_html()}"
        if self.throughput:
            out += f"<h4>Throughput (un-profiled, median of 3 steps)</h4>{self._throughput_table().to_html()}"
        return out

    def plot_png(self) -> bytes | None:
        if not any(t.peak_bytes is not None for t in self.trials):
            return None
        from ...core.render.plot import memory_law_png

        return memory_law_png(self)

    def to_html(self) -> str:
        return report_html(self._summary_html() + png_img(self.plot_png(), "peak memory against batch size")
                           + self._tables_html())

    def widget(self):
        pages: list[tuple[str, str | bytes]] = [("Answer", self._summary_html())]
        png = self.plot_png()
        if png:
            pages.append(("Memory law", png))
        pages.append(("Trials", self._tables_html()))
        return tabbed(pages)

    def __repr__(self) -> str:
        return f"<AutobatchResult {self.label}: batch_size={self.batch_size}, {len(self.trials)} trials>"
