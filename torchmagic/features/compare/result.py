"""The result of ``torchmagic.compare``: each variant's time, speedup with its confidence
interval, one-time compile cost, memory and numerical error against fp32 eager."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...core.devices import DeviceInfo
from ...core.expectations import Expectation, Measured
from ...core.render.base import Result
from .options import ComparedWith


HEADLINE_REASON_CHARS = 80  # of a failed variant's reason, in the headline


@dataclass
class VariantResult:
    name: str
    ok: bool = True                     # ran and was timed; False: see ``error`` (and ``fell_back``)
    error: str | None = None
    precision: str = "fp32"             # the tolerance class: fp32, tf32, fp16, bf16, int8
    dtype: str = "float32"              # what it computes in: float32, bfloat16 or float16 (autocast), tf32,
                                        # int8 dynamic, or a combination ("int8 dynamic+bfloat16")
    device: str | None = None           # where it ran: "cpu", "cuda:0"
    median_s: float | None = None       # seconds per run of the code
    iqr_s: float | None = None
    samples_s: list[float] = field(default_factory=list)   # one per round, in round order
    calls_per_sample: int = 1
    speedup: float | None = None        # median over rounds of eager's time / this variant's
    ci: tuple[float, float] | None = None  # 95% CI of the speedup (order statistics of the blocks' median ratios)
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
    graph_calls: int | None = None      # compiled graphs one run executed (the profiler's count, after warm-up)
    gave_up_on: list[str] = field(default_factory=list)  # functions dynamo gave up on: they ran eager
    recompiles: int | None = None       # recompiles during warm-up and timed runs
    fell_back: bool = False             # a compiled variant that ran no compiled graph: not timed, ``error`` says why
    notes: list[str] = field(default_factory=list)

    @property
    def runs_as(self) -> str:
        """Its dtype and device, e.g. "bfloat16, cpu"."""
        return self.dtype if self.device is None else f"{self.dtype}, {self.device}"

    @property
    def verdict(self) -> str:
        """'faster' or 'slower' when the 95% CI excludes 1, else 'no clear difference'."""
        if self.ci is None:
            return "baseline" if self.speedup == 1.0 else "unknown"
        low, high = self.ci
        return "faster" if low > 1 else "slower" if high < 1 else "no clear difference"

    def failure(self, width: int = HEADLINE_REASON_CHARS) -> str | None:
        """The headline's words for a variant that did not run, ``compile failed: <reason>`` or ``compile not
        compiled: <reason>``, the reason's first line cut to ``width`` (the report's notes give it whole);
        None when it ran."""
        if self.ok:
            return None
        reason = " ".join((self.error or "no reason given").splitlines()[0].split())
        if len(reason) > width:
            reason = reason[:width - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"
        return f"{self.name} {self.outcome}: {reason}"

    @property
    def outcome(self) -> str:
        """What became of it in a word or two: "ran", "failed", or "not compiled" (a compiled variant whose
        runs were all eager, never timed under its name)."""
        return "ran" if self.ok else "not compiled" if self.fell_back else "failed"

    @property
    def trustworthy(self) -> bool:
        """Ran, compiled when it says it compiles, and its output agrees with eager."""
        return self.ok and not self.fell_back and self.numerics_ok is not False

    def measured(self, expected: Expectation | None = None) -> Measured | None:
        """Its speedup with its 95% CI, as a finding's verify reads it; None without an interval."""
        return None if self.speedup is None or self.ci is None else Measured(self.speedup, self.ci, expected)

    def flags(self) -> list[str]:
        out = []
        if self.fell_back:
            out.append("not compiled")
        if self.gave_up_on:
            out.append(f"{len(self.gave_up_on)} function{'s' if len(self.gave_up_on) != 1 else ''} eager")
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
    device: DeviceInfo
    variants: list[VariantResult]
    rounds: int = 0
    blocks: int = 1       # the blocks the rounds fell into (each started afresh), the intervals' units
    seconds: float = 0.0
    amp_dtype: str = "bfloat16"
    options: ComparedWith = field(default_factory=ComparedWith)
    notes: list[str] = field(default_factory=list)
    expectation_check: Measured | None = None  # --expect: the one variant's speedup against the prediction

    def _view(self):
        from . import view  # imported when first shown (it imports this module for type checking only)

        return view

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

    # -- views: rendered by view.py ---------------------------------------------------
    def details(self) -> list[str]:
        return self._view().details(self)

    def plot_png(self) -> bytes | None:
        return self._view().plot_png(self)

    def interrupted_line(self) -> str:
        return f"interrupted after {self.rounds} timed rounds: the figures below cover them"

    def to_dict(self) -> dict:
        data = {**asdict(self), "device": self.device.to_dict()}
        data["best"] = self.best.name
        data["headline"] = self.headline()
        for entry, variant in zip(data["variants"], self.variants):
            entry["verdict"], entry["outcome"] = variant.verdict, variant.outcome
        return data

    def __repr__(self) -> str:
        return f"<CompareResult {self.label}: best={self.best.name}, {len(self.variants)} variants>"

