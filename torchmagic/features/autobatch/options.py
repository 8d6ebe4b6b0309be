"""What ``%autobatch`` / ``torchmagic.autobatch`` were asked for: the options a search runs with and keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...core.limits import SettingError
from .search import SearchSpace


@dataclass(frozen=True)
class AutobatchOptions:
    budget: float | None = None   # bytes (> 1) or a fraction of memory (<= 1); None: the default
    min: int = 1                  # batch sizes considered: min to max, multiples of multiple_of
    max: int = 65536
    multiple_of: int = 1
    margin: float = 0.1           # headroom kept below the budget
    target_batch: int | None = None
    throughput: bool = False      # also time samples/s at the answer and smaller verified sizes
    estimate: bool = True         # fit on fake-tensor estimates where the step allows it
    fresh: bool = False           # with ranks: each trial's reads in processes started for it

    def __post_init__(self):
        if self.budget is not None and not 0 < self.budget < math.inf:
            raise SettingError("budget", f"must be a positive number (bytes, or a fraction of memory), got {self.budget}")
        if not 0 <= self.margin < 1:
            raise SettingError("margin", f"must be in [0, 1), got {self.margin}")
        if self.target_batch is not None and self.target_batch < 1:
            raise SettingError("target_batch", f"must be at least 1, got {self.target_batch}")
        search_space(self)  # validates the range

    def limit(self, budget: int) -> int:
        """What a trial's peak must stay under: the budget less the margin."""
        return int(budget * (1 - self.margin))


def search_space(options: AutobatchOptions) -> SearchSpace:
    return SearchSpace(options.min, options.max, options.multiple_of)
