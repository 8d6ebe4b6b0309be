"""A finding's prediction and what its verify command measured: the closed loop.

A finding that can say what its fix will do predicts a range for the step's speedup on this machine
(``Expectation``); its verify command carries it (``--expect 1.15-1.30``), measures, and says whether the
measurement falls inside (``judge``).  What was measured is kept for the rest of the process
(``remember``), keyed by the rule and the code it was measured on, so the rule that predicted can read
it the next time it sees that code (``measured``) instead of repeating a prediction a measurement
contradicted.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from .limits import SettingError

MOST_REMOVED = 0.95   # a removal bound's largest share: no fix leaves a step 1/20 of itself by removing one part
_RANGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*-\s*(\d+(?:\.\d+)?)\s*x?\s*$")


@dataclass(frozen=True)
class Expectation:
    """A predicted speedup of the step (time now / time after the fix), as a range, and what it rests on."""

    low: float
    high: float
    basis: str = ""

    def text(self) -> str:
        return f"{self.low:.2f}-{self.high:.2f}x"

    def option(self) -> str:
        return f"--expect {self.low:.2f}-{self.high:.2f}"

    @classmethod
    def upgrade_saved(cls, data: Any) -> Any:
        """A verify run's options once kept the expectation as its text ("1.10-1.30x"): a saved result's."""
        return asdict(parse_expect(data)) if isinstance(data, str) else data

    @classmethod
    def removing(cls, share: float, what: str) -> "Expectation":
        """A fix that only takes work away (``what``, ``share`` of the step): the step is no slower, and at
        most as much faster as that share's removal makes it.  A bound, not a figure: the fix's own cost
        (a fused update still updates) lands it between."""
        share = min(max(share, 0.0), MOST_REMOVED)
        return cls(1.0, math.ceil(100 / (1 - share) - 1e-9) / 100, f"the fix removes at most {what}: {share:.0%} of the step")


@dataclass(frozen=True)
class Measured:
    """A speedup a verify command measured, with its 95% confidence interval."""

    speedup: float
    ci: tuple[float, float]
    expected: Expectation | None = None

    @property
    def verdict(self) -> "Verdict | None":
        """The measurement against its prediction (``verdict`` below), or None without one."""
        return verdict(self)


def parse_expect(text: str) -> Expectation:
    """``--expect 1.15-1.30``: a speedup range, low first, both finite and positive."""
    match = _RANGE.match(text or "")
    if match is None:
        raise SettingError("expect", f"takes a speedup range such as 1.15-1.30, got {text!r}")
    low, high = float(match[1]), float(match[2])
    if not (0 < low <= high) or not math.isfinite(high):
        raise SettingError("expect", f"the range must be positive, low first: got {text!r}")
    return Expectation(low, high)


def as_expectation(value: str | Expectation | None) -> Expectation | None:
    """The API's ``expect=``: a range written as ``--expect`` takes it, or an Expectation."""
    if value is None or isinstance(value, Expectation):
        return value
    if not isinstance(value, str):
        raise SettingError("expect", f"takes a range such as '1.15-1.30' or an Expectation, "
                                     f"got a {type(value).__name__}")
    return parse_expect(value)


@dataclass(frozen=True)
class Verdict:
    """A measurement against its prediction: ``within``, ``above`` (faster than predicted), ``below`` (slower), or
    ``inconclusive``, with why where it is (``reason``)."""

    outcome: str
    reason: str = ""


def verdict(measured: Measured) -> Verdict | None:
    """The rule, one for every verify command (docs/statistics.md): the 95% interval inside the predicted range
    reads ``within``; wholly above or below it, ``above`` or ``below``; across one of its edges no verdict can be
    given (``inconclusive``), and an interval wider than the range itself says so, as more rounds are the cure."""
    if measured.expected is None:
        return None
    e, (low, high) = measured.expected, measured.ci
    if high < e.low:
        return Verdict("below")
    if low > e.high:
        return Verdict("above")
    if e.low <= low and high <= e.high:
        return Verdict("within")
    if (math.log(high / low) if low > 0 else math.inf) > math.log(e.high / e.low):
        return Verdict("inconclusive", f"the interval is wider than the {e.text()} predicted, so it cannot fall "
                                       "inside it; more rounds (a quieter machine) narrow it")
    edge = e.low if low < e.low else e.high
    return Verdict("inconclusive", f"the interval spans the prediction's {'lower' if edge == e.low else 'upper'} "
                                   f"edge ({_x(edge)}x): the speedup may lie on either side of it")


def judge(what: str, measured: Measured) -> str | None:
    """One sentence: the measured speedup against the prediction (``verdict``), or None without a prediction."""
    judged = verdict(measured)
    if judged is None:
        return None
    e, (low, high) = measured.expected, measured.ci
    figure = f"{what} measured {_x(measured.speedup)}x (95% CI {_x(low)}-{_x(high)}x)"
    if judged.outcome == "within":
        return f"{figure}: inside the {e.text()} the finding predicted."
    if judged.outcome == "inconclusive":
        return f"{figure}: inconclusive against the {e.text()} the finding predicted: {judged.reason}."
    direction = "slower" if judged.outcome == "below" else "faster"
    return f"{figure}: {direction} than the {e.text()} the finding predicted; the finding is contradicted here."


def _x(speedup: float) -> str:
    """Two decimals, and two significant figures below 0.1: a 900x slowdown is not "0.00x"."""
    return f"{speedup:.2f}" if speedup >= 0.1 else f"{speedup:.2g}"


_MEASURED: dict[tuple[str, str], Measured] = {}


def code_key(code: str) -> str:
    """The identity of a cell's (or function's) code: its text, whitespace at the ends ignored."""
    return hashlib.sha1(code.strip().encode()).hexdigest()


def remember(rule: str, key: str | None, measured: Measured) -> None:
    if key is not None:
        _MEASURED[(rule, key)] = measured


def measured(rule: str, key: str | None) -> Measured | None:
    """What a verify command last measured for ``rule``'s fix on this code, in this process."""
    return _MEASURED.get((rule, key)) if key is not None else None
