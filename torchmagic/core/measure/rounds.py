"""Interleaved timing: every contender runs once per round, so machine drift hits all of them.

One sample is one block of calls timed together (device synchronised at its ends), divided
by the calls in it, as torch.utils.benchmark's blocked_autorange does; the order within a
round rotates, so each contender leads a round in turn.  A rotation keeps neighbours, and which
variants share the rounds moves each one's time by a few percent (docs/statistics.md); an order in which
each follows each other equally often moved it no nearer blocked_autorange's figure, so the rotation stays.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .cpu_wait import CpuWait

# Blocks last at least this long, so the timer's and loop's own cost stays negligible.
MIN_BLOCK_S = 1e-3
# Balanced blocks last at least this long.  A variant's block starts with ~10 ms of untimed calls (the calls just
# after another variant's run slow: compare/run.py); a block 2.5 times that keeps the untimed part of a round near
# 30%, so a comparison's seconds of timing cost less wall time (BERT, four variants: 6.3-8.9 s against 9.4-11 s with
# 10 ms blocks, which also read compile 1-2% further from blocked_autorange; docs/statistics.md).
MIN_BALANCED_BLOCK_S = 0.025
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
    contender never would), and a load that comes and goes meets every block for as long; at least
    MIN_BALANCED_BLOCK_S, so the transient after a switch is a small part of each."""
    slowest = max([s for s in seconds_per_call if math.isfinite(s)], default=0.0)
    block_s = min(max(slowest, MIN_BALANCED_BLOCK_S), MAX_BALANCED_BLOCK_S)
    return [calls_per_block(s, block_s) for s in seconds_per_call]


@dataclass(frozen=True)
class BlockStart:
    """What runs, untimed, before each block of rounds but the first: ``refresh`` (the allocator's cached
    memory handed back, as between two runs), then each contender's ``warm_ups`` call."""

    warm_ups: list[Callable[[], Any]]
    refresh: Callable[[], None] | None = None


class Rounds:
    """Per contender, the seconds per call of each round it completed (``samples``), kept as
    they come in, so an interrupted run still has what it measured.

    Each contender is a callable that times one block and returns (seconds, calls in it).
    With ``rounds``, exactly that many rounds; otherwise at least ``min_rounds`` and until
    every contender has spent ``min_time`` seconds in timed blocks.  A contender that raises
    is reported to ``on_error`` and leaves the rotation; the others go on.

    The rounds fall into ``blocks`` of equal length (``block_ends``), so that an interval can be made over
    the blocks' estimates: what stays the same for a whole run (the allocator's state, what ran before)
    differs between blocks as it does between runs, where a single run's rounds all share it.
    Before each block but the first, ``block_start`` (where given) runs untimed: each block then starts
    the way a new run starts after its warm-up.
    Without ``rounds``, the first block runs until ``min_rounds / blocks`` rounds and
    ``min_time / blocks`` seconds, and the others run as many rounds as it did.
    """

    def __init__(self, contenders: list[Callable[[], tuple[float, int]]], *, rounds: int | None = None,
                 min_time: float = 1.0, min_rounds: int = 10, blocks: int = 1, block_start: BlockStart | None = None):
        self.contenders = contenders
        self.rounds = rounds
        self.min_time = min_time
        self.min_rounds = min_rounds
        self.blocks = max(1, min(blocks, rounds)) if rounds is not None else max(1, blocks)
        self.block_start = block_start
        self.samples: list[list[float]] = [[] for _ in contenders]
        self.spent = [0.0] * len(contenders)
        self.done = 0
        self.block_ends: list[int] = []   # the rounds done at each finished block's end
        self.cpu_wait: float | None = None  # the share of its threads' ready time spent waiting for a CPU (cpu_wait.py)
        self._block_length: int | None = None

    def finished(self, active: list[int]) -> bool:
        if not active:
            return True
        if self.rounds is not None:
            return self.done >= self.rounds
        return len(self.block_ends) >= self.blocks

    def fewest(self) -> int:
        """The fewest rounds a run until min_time can end after."""
        return self.rounds if self.rounds is not None else self._fewest_per_block() * self.blocks

    def _fewest_per_block(self) -> int:
        return math.ceil(self.min_rounds / self.blocks)

    def block_lengths(self, rounds: int) -> list[int]:
        """The lengths of the blocks within the first ``rounds`` rounds (a block cut short counts with what
        it has): the blocks a paired interval is made over."""
        ends = [end for end in self.block_ends if end < rounds] + [rounds]
        return [b - a for a, b in zip([0] + ends, ends) if b > a]

    def run(self, on_round: Callable[[int], None] | None = None,
            on_error: Callable[[int, Exception], None] | None = None) -> list[list[float]]:
        __tracebackhide__ = True  # noqa: F841  (a contender's error is the user's)
        active, waited = list(range(len(self.contenders))), CpuWait()
        while not self.finished(active):
            if self.block_ends and self.block_ends[-1] == self.done and self.block_start is not None:
                self._start_block(active, on_error)
                if not active:
                    break
            shift = self.done % len(active)
            for i in active[shift:] + active[:shift]:
                timed = self._call(i, self.contenders[i], active, on_error)
                if timed is not None:
                    seconds, calls = timed
                    self.samples[i].append(seconds / calls)
                    self.spent[i] += seconds
            self.done += 1
            if active and self._block_ended(active):
                self.block_ends.append(self.done)
            if on_round is not None:
                on_round(self.done)
        self.cpu_wait = waited.share()  # (None after an interrupt)
        return self.samples

    def _start_block(self, active: list[int], on_error) -> None:
        __tracebackhide__ = True  # noqa: F841
        if self.block_start.refresh is not None:
            self.block_start.refresh()
        for i in list(active):
            self._call(i, self.block_start.warm_ups[i], active, on_error)

    def _block_ended(self, active: list[int]) -> bool:
        length = self.done - (self.block_ends[-1] if self.block_ends else 0)
        if self.rounds is not None:
            return self.done >= round((len(self.block_ends) + 1) * self.rounds / self.blocks)
        if self._block_length is None:
            if length < self._fewest_per_block() or \
                    min(self.spent[i] for i in active) < self.min_time / self.blocks:
                return False
            self._block_length = length
        return length >= self._block_length

    def _call(self, i: int, fn: Callable, active: list[int], on_error) -> Any:
        __tracebackhide__ = True  # noqa: F841
        failure = None
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001  (the contender's code is the user's)
            if on_error is None:
                raise
            failure = exc
        active.remove(i)  # outside the except block, so the failure's frames can be freed
        on_error(i, failure)
        del failure
        return None
