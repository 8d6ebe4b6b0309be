"""What ``%loadertune`` / ``torchmagic.loadertune`` were asked for: the options a sweep runs with
(``LoaderTuneOptions``, a training step among them) and what its result keeps of them (``TunedWith``,
plain data: the worker counts the sweep ran)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.expectations import Expectation
from ...core.limits import SettingError, check_count, check_seconds, check_workers
from ...core.measure import min_pairs

MIN_PAIRED_ROUNDS = min_pairs()  # 6: fewer paired passes cannot give a 95% interval


@dataclass(frozen=True)
class TunedWith:
    """The options a sweep ran with, as its result keeps and saves them."""

    workers: tuple[int, ...] = ()   # the worker counts swept (the default ones where none were given)
    batches: int | None = None
    seconds: float = 0.5
    rounds: int = MIN_PAIRED_ROUNDS
    expect: Expectation | None = None


@dataclass(frozen=True)
class LoaderTuneOptions:
    workers: tuple[int, ...] | None = None  # default: 0, 1, 2, 4, ... up to the CPU count
    batches: int | None = None              # batches timed per pass; default: as many as fit in ``seconds``
    seconds: float = 0.5                    # a pass times at least this long (and MIN_BATCHES batches)
    rounds: int = MIN_PAIRED_ROUNDS         # passes per setting, interleaved
    expect: Expectation | None = None       # a finding's predicted speedup of the change
    step: Callable[[Any], Any] | None = None  # a training step, timed alone and with the loaders (--step)

    def __post_init__(self):
        if self.workers is not None and (not self.workers or any(w < 0 for w in self.workers)):
            raise SettingError("workers", "takes worker counts such as 0,1,2,4 (0 or more)")
        check_workers(self.workers)
        if self.batches is not None and self.batches < 1:
            raise SettingError("batches", "must be at least 1")
        check_count("batches", self.batches)
        if not self.seconds > 0:
            raise SettingError("seconds", "must be positive")
        check_seconds("seconds", self.seconds)
        if self.rounds < 2:
            raise SettingError("rounds", "must be at least 2 (a confidence interval needs more than one)")
        check_count("rounds", self.rounds)

    def kept(self) -> TunedWith:
        """What the result keeps of these options: the worker counts swept, and no step (its time is the result's)."""
        return TunedWith(workers=self.workers or default_workers(), batches=self.batches, seconds=self.seconds,
                         rounds=self.rounds, expect=self.expect)


def default_workers(cpus: int | None = None) -> tuple[int, ...]:
    cpus = cpus or os.cpu_count() or 1
    counts = {0, cpus}
    n = 1
    while n < cpus:
        counts.add(n)
        n *= 2
    return tuple(sorted(counts))
