"""``torchmagic.diff(before, after)``: what changed between two profiles of the same step.

The step time's ratio with a distribution-free confidence interval (the two profiles' steps are
two samples, not pairs: core/measure/stats.unpaired_ratio), operators added, removed and changed
(per step: time and calls), the categories' shifts, and the findings that went away or appeared.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.expectations import Measured, judge
from ...core.measure.stats import unpaired_ratio
from ...core.render.base import Result
from .result import Finding, ProfileResult

CONFIDENCE = 0.95


@dataclass(frozen=True)
class OpChange:
    """One operator in either profile, per profiled step."""

    name: str
    calls_before: float
    calls_after: float
    seconds_before: float       # self time: on the GPU where both profiles have kernels, else on the CPU
    seconds_after: float

    @property
    def change_s(self) -> float:
        return self.seconds_after - self.seconds_before

    @property
    def status(self) -> str:
        if not self.calls_before:
            return "added"
        if not self.calls_after:
            return "removed"
        return "changed"


@dataclass(repr=False)
class ProfileDiff(Result):
    """Two profiles of one step, before and after a change.  Times are seconds per profiled step."""

    before: str
    after: str
    step_before_s: float                # median step
    step_after_s: float
    ratio: float                        # after / before: below 1, the step got faster
    ratio_ci: tuple[float, float] | None
    confidence: float | None            # the interval's exact coverage
    steps: tuple[int, int]
    time_basis: str                     # "GPU" (kernel time) or "CPU" (self CPU time) for the operators
    ops: list[OpChange] = field(default_factory=list)   # largest change first
    categories: dict[str, tuple[float, float]] = field(default_factory=dict)  # seconds per step, before and after
    findings_gone: list[Finding] = field(default_factory=list)
    findings_new: list[Finding] = field(default_factory=list)
    findings_kept: list[tuple[Finding, Finding]] = field(default_factory=list)  # (before, after)
    notes: list[str] = field(default_factory=list)

    def _view(self):
        from . import diff_view  # imported when first shown (it imports this module for type checking only)

        return diff_view

    @property
    def speedup(self) -> float:
        """before / after: above 1, the step got faster."""
        return 1 / self.ratio if self.ratio > 0 else float("inf")

    def op(self, name: str) -> OpChange | None:
        return next((o for o in self.ops if o.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["speedup"] = self.speedup
        return data


def profile_in(value: Any) -> ProfileResult | None:
    """The profile ``value`` stands for on one side of a diff: itself, or a one-rank TraceAnalysis's.  Told
    by type: no attribute of the user's object is read (a property or ``__getattr__`` may raise anything)."""
    from .traces.result import TraceAnalysis

    profile = value.profile if isinstance(value, TraceAnalysis) else value
    return profile if isinstance(profile, ProfileResult) else None


def step_problem(profile: ProfileResult) -> str | None:
    """Why ``profile`` has no step a diff can take a ratio with, in words that follow its name; None if it has."""
    if not profile.step_s:
        return "a profile with no complete step, not a profile with a step to compare"
    if not all(0 < s < math.inf for s in profile.step_s):  # a trace's clock can give these
        shown = ", ".join(f"{s:g}" for s in profile.step_s[:3]) + (", ..." if len(profile.step_s) > 3 else "")
        return f"its steps must each take a positive time to compare with, and they are {shown} s"
    return None


def diff_profiles(before: ProfileResult, after: ProfileResult, labels: tuple[str, str] | None = None) -> ProfileDiff:
    """Compare ``after`` with ``before`` (ProfileResults of one step, e.g. before and after a fix);
    ``labels`` name them (default: their own labels)."""
    for name, r in (("before", before), ("after", after)):
        if not r.step_s:
            raise ValueError(f"{name} ({r.label}) has no completed profiled step to compare")
    ratio = unpaired_ratio(after.step_s, before.step_s, confidence=CONFIDENCE)
    on_gpu = any(o.self_device_us for o in before.ops) and any(o.self_device_us for o in after.ops)
    was, now = _per_step(before, on_gpu), _per_step(after, on_gpu)
    ops = []
    for name in was.keys() | now.keys():
        calls_before, seconds_before = was.get(name, (0.0, 0.0))
        calls_after, seconds_after = now.get(name, (0.0, 0.0))
        ops.append(OpChange(name, calls_before, calls_after, seconds_before, seconds_after))
    ops.sort(key=lambda o: (-abs(o.change_s), o.name))
    categories = {c: (before.categories_s.get(c, 0.0) / before.steps, after.categories_s.get(c, 0.0) / after.steps)
                  for c in dict.fromkeys([*before.categories_s, *after.categories_s])}
    rules_before = {f.rule: f for f in before.findings}
    rules_after = {f.rule: f for f in after.findings}
    notes = []
    if ratio.ci is None:
        notes.append(f"No {CONFIDENCE:.0%} interval: it needs 4 profiled steps on each side "
                     f"(--steps 4), these have {before.steps} and {after.steps}.")
    notes.append("The two profiles ran one after the other: a change in the machine's load between them moves the "
                 "ratio too (--verify runs the two cells in interleaved rounds to cancel that, and judges the findings' "
                 "predictions so).")
    gone = [f for rule, f in rules_before.items() if rule not in rules_after]
    speedups = (1 / ratio.ci[1], 1 / ratio.ci[0]) if ratio.ci else (1 / ratio.estimate,) * 2
    for f in gone:  # a fixed finding's prediction, against the step time the fix brought
        if f.expected is not None and ratio.estimate > 0:
            notes.append(judge(f"{f.rule}: its fix gone, the step", Measured(1 / ratio.estimate, speedups, f.expected)))
    if before.device.kind != after.device.kind:
        notes.append(f"The profiles ran on different devices ({before.device.kind} and {after.device.kind}).")
    return ProfileDiff(
        before=labels[0] if labels else before.label, after=labels[1] if labels else after.label,
        step_before_s=before.median_step_s,
        step_after_s=after.median_step_s, ratio=ratio.estimate, ratio_ci=ratio.ci, confidence=ratio.confidence,
        steps=(before.steps, after.steps), time_basis="GPU" if on_gpu else "CPU", ops=ops, categories=categories,
        findings_gone=gone,
        findings_new=[f for rule, f in rules_after.items() if rule not in rules_before],
        findings_kept=[(f, rules_after[rule]) for rule, f in rules_before.items() if rule in rules_after],
        notes=notes)


def _per_step(r: ProfileResult, on_gpu: bool) -> dict[str, tuple[float, float]]:
    """Operator → (calls, seconds) per profiled step."""
    return {o.name: (o.calls / r.steps, (o.self_device_us if on_gpu else o.self_cpu_us) / 1e6 / r.steps)
            for o in r.ops}
