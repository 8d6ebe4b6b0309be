"""What ``%%amp_compare`` / ``torchmagic.compare`` were asked for: the options a comparison runs with
(``CompareOptions``, its variants as code) and what its result keeps of them (``ComparedWith``, plain
data: the variants by name)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...core.expectations import Expectation
from ...core.limits import SettingError, check_count, check_seconds
from .variants import Variant

AMP_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


@dataclass(frozen=True)
class ComparedWith:
    """The options a comparison ran with, as its result keeps and saves them."""

    variants: tuple[str, ...] = ()  # by name, eager first
    runs: int | None = None         # rounds; None: until min_time
    min_time: float = 1.0
    min_rounds: int = 10
    warmup: int = 3
    dtype: str | None = None        # autocast dtype asked for (None: the device's choice; the result's amp_dtype)
    atol: float | None = None
    rtol: float | None = None
    restore: bool = True
    expect: Expectation | None = None


@dataclass(frozen=True)
class CompareOptions:
    variants: tuple[Variant, ...]
    runs: int | None = None        # rounds; None: until min_time
    min_time: float = 1.0          # seconds of timed runs per variant (at least MIN_ROUNDS rounds)
    min_rounds: int = 10
    warmup: int = 3
    dtype: str | None = None       # autocast dtype for amp: bf16 or fp16 (default: the device's choice)
    atol: float | None = None
    rtol: float | None = None
    restore: bool = True
    expect: Expectation | None = None  # a finding's predicted speedup of the one variant besides eager

    def __post_init__(self):
        if self.runs is not None and self.runs < 2:
            raise SettingError("runs", "needs at least 2 rounds (a confidence interval needs more than one)")
        check_count("runs", self.runs)
        if not self.min_time > 0:
            raise SettingError("min_time", "must be positive")
        check_seconds("min_time", self.min_time)
        if self.warmup < 0:
            raise SettingError("warmup", "cannot be negative")
        check_count("warmup", self.warmup)
        if self.dtype is not None and self.dtype not in AMP_DTYPES:
            raise SettingError("dtype", f"is bf16 or fp16, got {self.dtype!r}")
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < math.inf:
                raise SettingError(name, "must be a non-negative number")
        if not self.variants or not self.variants[0].is_baseline:
            raise ValueError("the first variant must be the eager baseline")
        if self.expect is not None and len(self.variants) != 2:  # a prediction is of one fix
            raise SettingError("expect", "judges one variant's speedup: give exactly one besides eager, "
                                         "e.g. --variants eager,amp")

    def kept(self) -> ComparedWith:
        """What the result keeps of these options: the variants by name."""
        return ComparedWith(variants=tuple(v.name for v in self.variants), runs=self.runs, min_time=self.min_time,
                            min_rounds=self.min_rounds, warmup=self.warmup, dtype=self.dtype, atol=self.atol,
                            rtol=self.rtol, restore=self.restore, expect=self.expect)
