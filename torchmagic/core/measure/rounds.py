"""Interleaved timing: every contender runs once per round, so machine drift hits all of them.

One sample is one block of calls timed together (device synchronised at its ends), divided
by the calls in it, as torch.utils.benchmark's blocked_autorange does; the order within a
round rotates, so no contender always follows the same neighbour.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# Blocks last at least this long, so the timer's and loop's own cost stays negligible.
MIN_BLOCK_S = 1e-3
# Balanced blocks last at most this long: a run slower than that (or a first run, timed with the
# compile in it when there is no warm-up) gets a block of its own, and the others stay short.
MAX_BALANCED_BLOCK_S = 0.1


def calls_per_block(seconds_per_call: float, block_s: float = MIN_BLOCK_S) -> int:
    """Calls that fill a block of ``block_s`` seconds (at least MIN_BLOCK_S), at least one."""
    if seconds_per_call <= 0 or not math.isfinite(seconds_per_call):
        return 1
    return max(1, math.ceil(max(block_s, MIN_BLOCK_S) / seconds_per_call))


def balanced_calls(seconds_per_call: list[float]) -> list[int]:
    """Calls per block for contenders that share rounds, so that every block lasts about as long
    as the slowest contender's single call: each then gets the same seconds of timing per round
    (a round of unequal blocks gives the slow one most of the time, as blocked_autorange run per
    contender never would), and a load that comes and goes meets every block for as long."""
    block_s = min(max([s for s in seconds_per_call if math.isfinite(s)], default=0.0), MAX_BALANCED_BLOCK_S)
    return [calls_per_block(s, block_s) for s in seconds_per_call]


class Rounds:
    """Per contender, the seconds per call of each round it completed (``samples``), kept as
    they come in, so an interrupted run still has what it measured.

    Each contender is a callable that times one block and returns (seconds, calls in it).
    With ``rounds``, exactly that many rounds; otherwise at least ``min_rounds`` and until
    every contender has spent ``min_time`` seconds in timed blocks.  A contender that raises
    is reported to ``on_error`` and leaves the rotation; the others go on.
    """

    def __init__(self, contenders: list[Callable[[], tuple[float, int]]], *, rounds: int | None = None,
                 min_time: float = 1.0, min_rounds: int = 10):
        self.contenders = contenders
        self.rounds = rounds
        self.min_time = min_time
        self.min_rounds = min_rounds
        self.samples: list[list[float]] = [[] for _ in contenders]
        self.spent = [0.0] * len(contenders)
        self.done = 0

    def finished(self, active: list[int]) -> bool:
        if not active:
            return True
        if self.rounds is not None:
            return self.done >= self.rounds
        return self.done >= self.min_rounds and min(self.spent[i] for i in active) >= self.min_time

    def run(self, on_round: Callable[[int], None] | None = None,
            on_error: Callable[[int, Exception], None] | None = None) -> list[list[float]]:
        __tracebackhide__ = True  # noqa: F841  (a contender's error is the user's)
        active = list(range(len(self.contenders)))
        while not self.finished(active):
            shift = self.done % len(active)
            for i in active[shift:] + active[:shift]:
                failure = None
                try:
                    seconds, calls = self.contenders[i]()
                except Exception as exc:  # noqa: BLE001  (the contender's code is the user's)
                    if on_error is None:
                        raise
                    failure = exc
                if failure is not None:  # handled outside the except block, so its frames can be freed
                    active.remove(i)
                    on_error(i, failure)
                    del failure
                    continue
                self.samples[i].append(seconds / calls)
                self.spent[i] += seconds
            self.done += 1
            if on_round is not None:
                on_round(self.done)
        return self.samples
