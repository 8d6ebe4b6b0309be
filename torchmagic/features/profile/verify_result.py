"""The result of ``%%torchprofile --verify`` / ``torchmagic.profile(..., verify=...)``: the profiled code and the
code with the fix, timed in interleaved rounds, and the verdict against the finding's prediction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.expectations import Expectation, Measured, Verdict, verdict
from ...core.render.base import Result


@dataclass(repr=False)
class VerifyResult(Result):
    """Before (the profiled code) and after (the code with the fix), run alternately in rounds: the speedup is
    the median of the rounds' before/after ratios, its interval made over blocks of rounds (stats.paired_ratio).
    Times are seconds per run of the code."""

    before: str                              # what ran as before: "prof (In [3])"
    after: str
    speedup: float                           # before / after: above 1, the fix made the code faster
    ci: tuple[float, float] | None           # None with fewer blocks than a 95% interval needs
    confidence: float | None                 # the interval's exact coverage
    rounds: int
    blocks: int
    before_s: float                          # median seconds a run
    after_s: float
    expected: Expectation | None = None      # --expect: the finding's predicted speedup
    cpu_wait: float | None = None            # share of its threads' ready time spent waiting for a CPU (Linux)
    notes: list[str] = field(default_factory=list)

    def _view(self):
        from . import verify_view  # imported when first shown (it imports this module for type checking only)

        return verify_view

    @property
    def expectation_check(self) -> Measured | None:
        """The speedup against the prediction, as %%amp_compare's and %loadertune's ``expectation_check``."""
        if self.expected is None or self.ci is None:
            return None
        return Measured(self.speedup, self.ci, self.expected)

    @property
    def verdict(self) -> Verdict | None:
        """within, above, below or inconclusive (core/expectations.verdict); None without a prediction."""
        if self.expected is None:
            return None
        if self.ci is None:
            return Verdict("inconclusive", f"no 95% interval: it needs 6 blocks of rounds, these had {self.blocks}")
        return verdict(self.expectation_check)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = asdict(self.verdict) if self.verdict else None
        return data
