"""A step that keeps memory from one call to the next (a leak), seen in the runs of a search's trials.

Each run of a trial is ``TRIAL_STEPS`` calls from the user's state, after which that state is put back
and memory released: what is still held then, beyond what was held before the run, is what the step
keeps where torchmagic cannot put it back (a list it appends to, a global, ``loss`` kept with its graph,
a hook that stores outputs).  A size's first run may keep some once: oneDNN's primitives for a new shape
(4.4 MiB for a small transformer at a new batch size, then 0 B in each of five more runs, torch 2.13 on
CPU), cuBLAS's workspace at a GPU's first matmul, a cache the step fills lazily.  So a leak is held
memory that grew after each of the last ``LEAK_RUNS`` runs at one size after its first, each time by
more per call than ``LEAK_FLOOR_BYTES`` and than ``LEAK_SHARE`` of the trial's peak.  A CPU trial makes
those runs anyway (its footprint reads); a GPU trial, one run, makes up to ``LEAK_RUNS`` more only where
its run left memory held.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

from ...core.devices import Device
from .search import TRIAL_STEPS

LEAK_RUNS = 2                   # runs at one size, after its first, that must each have grown
LEAK_FLOOR_BYTES = 64 * 2**10   # per call: malloc's noise between runs of a step is 0-1 KiB (glibc, torch 2.13)
LEAK_SHARE = 0.01               # per call, of the trial's peak: 1% a step doubles the peak in 100 steps


@dataclass(frozen=True)
class Leak:
    """Memory the step kept from call to call at one size, where the search stopped."""

    batch_size: int         # the size whose runs each left more held
    per_call_bytes: int     # held memory's growth per call of the step there (the last runs' mean)
    runs: int               # runs in a row at that size after its first (each ``TRIAL_STEPS`` calls) that grew

    @property
    def per_sample_bytes(self) -> float:
        return self.per_call_bytes / self.batch_size


class LeakFound(Exception):
    """A trial's runs showed a leak: the search stops there."""

    def __init__(self, leak: Leak):
        super().__init__(f"memory held grew by {leak.per_call_bytes} bytes per call at batch {leak.batch_size}")
        self.leak = leak


class LeakWatch:
    """The memory held after each run of one search's trials, by size, and the leak it shows, if any."""

    def __init__(self, device: Device):
        self.device = device
        self.watched = device.memory_held() is not None  # not where nothing exact can be read (not glibc)
        self.grown: dict[int, list[float]] = {}  # by size: what each run there left held, per call
        self.leak: Leak | None = None
        self._size, self._floor, self._held = 0, LEAK_FLOOR_BYTES, None

    def around_runs(self, size: int, reset: Callable[..., None]) -> Callable[..., None]:
        """``reset`` for the runs of a trial at ``size``: after it puts the state back, what the run left
        held is read."""
        if not self.watched:
            return reset
        self._size, self._floor, self._held = size, LEAK_FLOOR_BYTES, self.device.memory_held()

        def reset_and_read(collect: bool = True) -> None:
            reset(collect=collect)
            self._ran(collected=collect)

        return reset_and_read

    def peaked(self, peak_bytes: int | None) -> None:
        """The trial's first run peaked at ``peak_bytes``: growth below a share of it is not a leak."""
        self._floor = max(LEAK_FLOOR_BYTES, LEAK_SHARE * (peak_bytes or 0))

    def confirm(self, run_again: Callable[[], bool]) -> None:
        """Up to ``LEAK_RUNS`` more runs at the trial's size (``run_again``: False where one ran out of
        memory) while its last run left more held and the runs do not yet decide."""
        for _ in range(LEAK_RUNS):
            grown = self.grown.get(self._size, [])
            if self.leak is not None or not grown or grown[-1] <= self._floor or not run_again():
                return

    def _ran(self, collected: bool) -> None:
        held = self.device.memory_held()
        if held is None or self._held is None:
            return
        if held - self._held > TRIAL_STEPS * self._floor and not collected:
            gc.collect()  # garbage in reference cycles is not kept: only what survives a collection counts
            held = self.device.memory_held()
        grown = self.grown.setdefault(self._size, [])
        grown.append((held - self._held) / TRIAL_STEPS)
        self._held = held
        later = grown[1:][-LEAK_RUNS:]  # the size's first run may make what is made once
        if len(later) == LEAK_RUNS and all(g > self._floor for g in later):
            self.leak = Leak(self._size, round(sum(later) / len(later)), _trailing_over(grown[1:], self._floor))


def _trailing_over(values: list[float], floor: float) -> int:
    """How many of the last ``values`` in a row are over ``floor``."""
    count = 0
    for value in reversed(values):
        if value <= floor:
            break
        count += 1
    return count
