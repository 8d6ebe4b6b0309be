"""The result of ``torchmagic.compare``: each variant's time, speedup with its confidence
interval, one-time compile cost, memory and numerical error against fp32 eager."""

from __future__ import annotations

import html
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.render.base import Result, png_img, report_html, tabbed
from ...core.render.format import fmt_bytes, fmt_s
from ...core.render.table import Column, Table


@dataclass
class VariantResult:
    name: str
    ok: bool = True                     # ran and was timed; False: see ``error``
    error: str | None = None
    precision: str = "fp32"
    median_s: float | None = None       # seconds per run of the code
    iqr_s: float | None = None
    samples_s: list[float] = field(default_factory=list)   # one per round, in round order
    calls_per_sample: int = 1
    speedup: float | None = None        # eager's median / this median
    ci: tuple[float, float] | None = None  # 95% CI of the speedup (paired bootstrap over rounds)
    first_call_s: float | None = None
    compile_s: float | None = None      # one-time cost: the first run (and any build) beyond a usual run
    compile_cache: str | None = None    # "cold", "warm disk cache" or "in memory" (compiled earlier)
    break_even_runs: int | None = None  # runs after which the one-time cost is paid back
    peak_bytes: int | None = None       # peak of torch's allocations in one run, above its start
    graph_pool_bytes: int | None = None  # CUDA graph pool memory it recorded into and holds (a replay allocates none)
    max_abs_err: float | None = None
    max_rel_err: float | None = None    # max_abs_err / max |eager output|
    numerics_ok: bool | None = None     # None: not compared (see notes)
    tolerance: tuple[float, float] | None = None  # (rtol, atol) it was judged by
    graphs: int | None = None           # graphs compiled on the first run
    graph_breaks: int | None = None
    recompiles: int | None = None       # recompiles during warm-up and timed runs
    fell_back: bool = False             # a compiled variant that ran eager
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """'faster' or 'slower' when the 95% CI excludes 1, else 'no clear difference'."""
        if self.ci is None:
            return "baseline" if self.speedup == 1.0 else "unknown"
        low, high = self.ci
        return "faster" if low > 1 else "slower" if high < 1 else "no clear difference"

    @property
    def trustworthy(self) -> bool:
        """Ran, compiled when it says it compiles, and its output agrees with eager."""
        return self.ok and not self.fell_back and self.numerics_ok is not False

    def flags(self) -> list[str]:
        out = []
        if self.fell_back:
            out.append("ran eager")
        if self.numerics_ok is False:
            out.append("error over tolerance")
        if self.recompiles:
            out.append(f"recompiled {self.recompiles}×")
        if self.graph_breaks:
            out.append(f"{self.graph_breaks} graph break{'s' if self.graph_breaks != 1 else ''}")
        if self.compile_cache == "warm disk cache":
            out.append("warm cache")
        elif self.compile_cache == "in memory":
            out.append("reused compile")
        return out


@dataclass
class CompareResult(Result):
    label: str
    device: dict[str, Any]
    variants: list[VariantResult]
    rounds: int = 0
    seconds: float = 0.0
    amp_dtype: str = "bfloat16"
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def baseline(self) -> VariantResult:
        return self.variants[0]

    def __getitem__(self, name: str) -> VariantResult:
        for variant in self.variants:
            if variant.name == name:
                return variant
        raise KeyError(name)

    @property
    def best(self) -> VariantResult:
        """The fastest variant that is faster than eager with 95% confidence and trustworthy;
        eager when none is."""
        faster = [v for v in self.variants[1:] if v.trustworthy and v.verdict == "faster"]
        return max(faster, key=lambda v: v.speedup) if faster else self.baseline

    def headline(self) -> str:
        base = self.baseline
        if not base.ok:
            return f"No comparison: eager failed ({base.error})."
        best = self.best
        if best is base:
            measured = [v for v in self.variants[1:] if v.ok]
            if not measured:
                return "No variant ran besides eager (see below)."
            return "eager is fastest: no variant was faster with 95% confidence" + _slower_summary(measured)
        low, high = best.ci
        parts = [f"{best.name}: {best.speedup:.2f}× faster than eager (95% CI {low:.2f}–{high:.2f})"]
        if best.max_rel_err is not None:
            parts.append(f"max rel err {_fmt_err(best.max_rel_err)}")
        if best.compile_s is not None:
            parts.append(f"pays off after {best.break_even_runs:,} runs" if best.break_even_runs is not None
                         else f"one-time cost {fmt_s(best.compile_s)}")
        return ", ".join(parts)

    def details(self) -> list[str]:
        lines = [f"{self.rounds} interleaved rounds in {fmt_s(self.seconds)} on "
                 f"{self.device.get('name', self.device.get('kind'))}; medians per run, speedup CIs by paired "
                 f"bootstrap over rounds; errors against fp32 eager's output (relative to its largest value)"]
        lines += self.notes
        for v in self.variants:
            if v.error:
                lines.append(f"{v.name} failed: {v.error}")
            lines += [f"{v.name}: {note}" for note in v.notes]
        return lines

    def _table(self) -> Table:
        return Table([
            Column("variant", lambda v: v.name, "left"),
            Column("median", lambda v: fmt_s(v.median_s)),
            Column("IQR", lambda v: fmt_s(v.iqr_s)),
            Column("speedup (95% CI)", _fmt_speedup),
            Column("compile", lambda v: fmt_s(v.compile_s), optional=True),
            Column("pays off after", _fmt_break_even, optional=True),
            Column("peak mem", lambda v: fmt_bytes(v.peak_bytes)),
            Column("graph pool", lambda v: fmt_bytes(v.graph_pool_bytes), optional=True),
            Column("max rel err", lambda v: _fmt_err(v.max_rel_err) + ("" if v.numerics_ok is not False else " ✗")),
            Column("notes", lambda v: "failed" if not v.ok else ", ".join(v.flags()), "left", optional=True),
        ], self.variants, noun="variants")

    def interrupted_line(self) -> str:
        return f"interrupted after {self.rounds} timed rounds: the figures below cover them"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["best"] = self.best.name
        data["headline"] = self.headline()
        for entry, variant in zip(data["variants"], self.variants):
            entry["verdict"] = variant.verdict
        return data

    def to_text(self) -> str:
        return "\n".join([self.headline(), "", self._table().to_text(), "", *self.details()])

    def plot_png(self) -> bytes | None:
        if not any(v.ci for v in self.variants):
            return None
        from ...core.render.plot import speedup_png

        return speedup_png(self)

    def _summary_html(self) -> str:
        details = "".join(f'<div class="tm-note">{html.escape(line)}</div>' for line in self.details())
        return (f'<div class="tm-headline">{html.escape(self.headline())}</div>'
                f"{self._table().to_html()}{details}")

    def to_html(self) -> str:
        return report_html(self._summary_html()
                           + png_img(self.plot_png(), "speedup over eager with 95% confidence intervals"))

    def widget(self):
        pages: list[tuple[str, str | bytes]] = [("Verdict", self._summary_html())]
        png = self.plot_png()
        if png:
            pages.append(("Chart", png))
        return tabbed(pages)

    def __repr__(self) -> str:
        return f"<CompareResult {self.label}: best={self.best.name}, {len(self.variants)} variants>"


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


def _slower_summary(measured: list[VariantResult]) -> str:
    slower = [v for v in measured if v.verdict == "slower"]
    if not slower:
        return ""
    return " (slower: " + ", ".join(f"{v.name} {v.speedup:.2f}×" for v in slower) + ")"
