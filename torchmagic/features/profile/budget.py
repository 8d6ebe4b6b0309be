"""The profile's host-memory budget: stop before the step whose events would pass it.

kineto holds every event in host memory until the profiler stops, and the stop then turns them into
torch's event objects; users have seen a notebook kernel killed for it (tens of GB).  So the engine reads
the memory the process holds after each profiled run (malloc's bytes in use where glibc says, else the
resident size) and projects what the next run would bring, times what the stop multiplies it by.

``STOP_FACTOR``: what the process held once the profiler stopped and its events were read, over what
the capture held before the stop, measured here (torch 2.13, CPU): 8.1x (a 40-layer MLP's training step,
record_shapes) and 10.1x (the same, stacks and memory) from malloc's count; 10.6x and 14.0x from the
resident high-water mark (500k and 1.1M ``aten::add`` events).  The largest is taken.
"""

from __future__ import annotations

from ...core.devices import host_memory
from ...core.devices.resident import heap_in_use, resident_bytes
from ...core.render.format import fmt_bytes

STOP_FACTOR = 14.0
DEFAULT_SHARE = 0.5  # of the memory available at the start: the other half stays for the cell's own tensors


class CaptureBudgetError(ValueError):
    """The budget cannot hold even one profiled run of the step (one line, for the magic and the API);
    raised once the profiler has stopped and its events are dropped."""


class CaptureBudget:
    """``start()`` once the profiler runs, ``after_run()`` after each run it records; ``stops()`` says
    whether the next run would pass the budget, ``too_small()`` whether the first one did."""

    __slots__ = ("limit", "source", "held", "runs", "warmed", "_read", "_base", "_last")

    def __init__(self, setting: float | None, warmed: bool = True):
        """``setting``: bytes (over 1), a fraction of the available memory (up to 1), or None (the default).
        ``warmed``: an un-profiled run came before the profiler started.  Without one, the first profiled
        run also holds what the step keeps of its own the first time (a model it builds, gradients,
        optimizer state: gigabytes that are not events), so nothing is judged from that run alone."""
        share = DEFAULT_SHARE if setting is None else setting
        if share <= 1:
            available = host_memory().available_bytes
            self.limit = int(share * available)
            self.source = (f"{'the default, ' if setting is None else ''}{share:g} of the {fmt_bytes(available)} "
                           "available")
        else:
            self.limit, self.source = int(setting), "as set"
        self._read = heap_in_use if heap_in_use() is not None else resident_bytes
        self._base = self.held = self._last = self.runs = 0  # held: bytes above the start
        self.warmed = warmed

    def start(self) -> None:
        self._base = self._read() or 0

    def after_run(self) -> None:
        held = max((self._read() or 0) - self._base, 0)
        self._last, self.held, self.runs = max(held - self.held, 0), held, self.runs + 1

    def estimate(self, runs: int) -> int:
        """The memory ``runs`` runs would hold once the profiler stops: each run's events as the last one
        brought, times the stop's factor, and what else the runs kept (a first step's gradients) once."""
        if not self.known():
            return 0
        per_run = self._last if self.runs > 1 else self.held
        kept = max(self.held - per_run * self.runs, 0)
        return int(STOP_FACTOR * per_run * runs + kept)

    def known(self) -> bool:
        """Whether a run's events can be told yet: after a warmed run, or the growth between two."""
        return self.runs >= (1 if self.warmed else 2)

    def stops(self) -> bool:
        return self.known() and self.estimate(self.runs + 1) > self.limit

    def too_small(self) -> str | None:
        """Why the budget cannot hold even the one run recorded so far once the profiler stops, or None."""
        if self.runs != 1 or not self.warmed or self.estimate(1) <= self.limit:
            return None
        return (f"capture budget {fmt_bytes(self.limit)} ({self.source}) too small for one profiled run: it held "
                f"{fmt_bytes(self.held)}, about {fmt_bytes(self.estimate(1))} once the profiler stops; raise the "
                "budget, or profile a smaller step")

    def note(self, steps: int, asked: int) -> str:
        """The one line for a profile stopped after ``steps`` of the ``asked`` steps."""
        return (f"Capture budget: {steps} of the {asked} steps asked were profiled. The profiler held "
                f"{fmt_bytes(self.held)} after them, about {fmt_bytes(self.estimate(self.runs))} once stopped "
                f"({STOP_FACTOR:g}x its events, measured); another step would pass the budget of "
                f"{fmt_bytes(self.limit)} ({self.source}), and all {asked} about "
                f"{fmt_bytes(self.estimate(self.runs - steps + asked))}. Profile fewer steps, or raise "
                "--capture-budget.")
