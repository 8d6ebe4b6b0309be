"""``--verify``: a finding's fix measured against the profiled code, and judged against the finding's prediction.

The fixes these findings suggest (sync, copies, optimizer, gpu_idle, tensor_core_alignment) are edits of the code:
so the profiled code (before) and the edited one (after) run alternately in rounds, as %%amp_compare runs its
variants, and the speedup is the median of the rounds' before/after ratios with a 95% interval over blocks of rounds
(core/measure/stats.paired_ratio).  Two profiles taken one after the other cannot do that: a load that changes
between them moves their ratio (a fix predicted 1.00-1.12x read 0.63x so, and 1.66x interleaved).

Each side's block of calls starts from the state the verify started with: the objects the code changes (weights,
optimizer state and settings, RNG: core/state.Snapshot) and the namespace's names.  A fix may change that state
(``group['fused'] = True`` at the top of the edited cell), and the before side must not run with it.  Everything
is put back afterwards, torch's settings too, so the verify itself trains nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.devices import Device
from ...core.devices.profiler import ensure_profiler_free
from ...core.expectations import Expectation
from ...core.gc_pause import gc_paused
from ...core.interrupts import deliver_pending, guards, uninterruptible
from ...core.limits import SettingError
from ...core.measure import BlockStart, Rounds, balanced_calls, calls_per_block, min_pairs, paired_ratio, timed_block, timed_call
from ...core.outcome import Outcome
from ...core.settings import TorchSettings
from ...core.shell import is_internal
from ...core.state import Snapshot
from .verify_result import VerifyResult

BLOCKS = min_pairs()  # the fewest blocks that give a distribution-free 95% interval (as %%amp_compare's)
MIN_ROUNDS = 2 * BLOCKS
# A block's timed calls follow untimed ones lasting this long where calls are shorter than LEAD_IN_MAX_S: the calls
# right after the other side's, or after the state was put back, find the caches holding something else, which no
# step in a loop pays (compare/run.py measured that tail on BERT); a longer call's tail is a small part of it.
LEAD_IN_S = 0.01
LEAD_IN_MAX_S = 0.1
BUSY_CPU_WAIT = 0.10  # from this share of their ready time waiting for a CPU, the rounds ran on a busy machine


@dataclass(frozen=True)
class VerifyOptions:
    expect: Expectation | None = None   # the finding's predicted speedup (--expect)
    min_time: float = 1.0               # seconds of timed calls a side, at least
    warmup: int = 1                     # untimed calls a side after its first, before the rounds

    def __post_init__(self):
        if not self.min_time > 0:
            raise SettingError("min_time", f"must be a positive number of seconds, got {self.min_time}")
        if self.warmup < 0:
            raise SettingError("warmup", f"must be 0 or more, got {self.warmup}")


@dataclass(frozen=True)
class Sides:
    """The two codes compared, as zero-argument callables, and what the report calls them."""

    before: Callable[[], Any]
    after: Callable[[], Any]
    labels: tuple[str, str] = ("before", "after")


@guards
def run_verify(sides: Sides, options: VerifyOptions, *, state: list[Any], device: Device,
               namespace: dict[str, Any] | None = None) -> Outcome[VerifyResult]:
    """Time ``sides.before`` and ``sides.after`` in interleaved rounds, each block from the same start: the
    objects in ``state`` and the names in ``namespace`` (where the code is a cell's) as they are now."""
    __tracebackhide__ = True  # noqa: F841  (a failing cell shows the user's frames only)
    ensure_profiler_free()  # profiled calls would time the profiler
    return _Verification(sides, options, device, _Start(state, device, namespace)).run()


class _Start:
    """The state both sides start each block from: the objects' state and the namespace's bindings."""

    def __init__(self, state: list[Any], device: Device, namespace: dict[str, Any] | None):
        self.snapshot = Snapshot(state, device)
        self.namespace = namespace
        self.bindings = dict(namespace) if namespace is not None else None

    @uninterruptible
    def reset(self) -> None:
        if self.namespace is not None:  # names a side assigned go; rebound ones get their value back
            for name in [n for n in self.namespace if n not in self.bindings and not is_internal(n)]:
                del self.namespace[name]
            self.namespace.update(self.bindings)
        self.snapshot.restore()


class _Verification:
    def __init__(self, sides: Sides, options: VerifyOptions, device: Device, start: _Start):
        self.calls = [sides.before, sides.after]
        self.labels, self.options, self.device, self.start = sides.labels, options, device, start
        self.rounds: Rounds | None = None

    def run(self) -> Outcome[VerifyResult]:
        __tracebackhide__ = True  # noqa: F841
        settings = TorchSettings.capture()
        error = None
        try:
            call_s = [self._first_calls(i) for i in range(2)]
            self._timed_rounds(call_s)
        except BaseException as exc:  # noqa: BLE001  (the user's error, or an interrupt: the caller re-raises it)
            error = exc
        finally:
            self._put_back(settings)
        return Outcome(self._result(), None, error)

    def _first_calls(self, i: int) -> float:
        """From the start: one call, then the warm-up ones; the fastest of them sizes the blocks."""
        __tracebackhide__ = True  # noqa: F841
        self.start.reset()
        times = [timed_call(self.calls[i], self.device)[1] for _ in range(1 + self.options.warmup)]
        return min(times)

    def _timed_rounds(self, call_s: list[float]) -> None:
        __tracebackhide__ = True  # noqa: F841
        blocks = [self._block(i, calls, s) for i, (calls, s) in enumerate(zip(balanced_calls(call_s), call_s))]
        self.rounds = Rounds(blocks, min_time=self.options.min_time, min_rounds=MIN_ROUNDS, blocks=BLOCKS,
                             block_start=BlockStart([lambda: None] * 2, refresh=self.device.empty_cache))
        self.rounds.run()

    def _block(self, i: int, calls: int, seconds_per_call: float) -> Callable[[], tuple[float, int]]:
        call = self.calls[i]
        lead_in = calls_per_block(seconds_per_call, LEAD_IN_S) if seconds_per_call < LEAD_IN_MAX_S else 0

        def run_block() -> tuple[float, int]:
            __tracebackhide__ = True  # noqa: F841
            with gc_paused():
                self.start.reset()
                for _ in range(lead_in):
                    call()
                return timed_block(call, calls, self.device), calls

        return run_block

    @uninterruptible
    def _put_back(self, settings: TorchSettings) -> None:
        """The objects, the names and torch's settings as the verify found them; a Ctrl-C waits for all of it."""
        self.start.reset()
        settings.restore()
        deliver_pending()

    def _result(self) -> VerifyResult | None:
        """What the rounds measured, as far as they went (an interrupt leaves fewer)."""
        if self.rounds is None:
            return None
        before, after = self.rounds.samples
        n = min(len(before), len(after))
        if n == 0:
            return None
        ratio = paired_ratio(before[:n], after[:n], blocks=self.rounds.block_lengths(n))
        result = VerifyResult(before=self.labels[0], after=self.labels[1], speedup=ratio.estimate, ci=ratio.ci,
                              confidence=ratio.confidence, rounds=n, blocks=ratio.blocks or 0,
                              before_s=statistics.median(before[:n]), after_s=statistics.median(after[:n]), expected=self.options.expect,
                              cpu_wait=self.rounds.cpu_wait)
        if result.cpu_wait is not None and result.cpu_wait >= BUSY_CPU_WAIT:
            result.notes.append(f"The machine was busy: the rounds' threads waited for a CPU {result.cpu_wait:.0%} of "
                                "the time they were ready to run, which widens the interval; free the cores or give "
                                "it more time.")
        return result


def same_code_note(before: str, after: str) -> str | None:
    """A verify of code identical to the profiled one measures nothing: say where the fix must go."""
    if before.strip() != after.strip():
        return None
    return ("This code is the profiled code itself: both sides ran the same, so the fix was not measured. Put the fix "
            "in this cell (a fix run in another cell changed what both sides run with).")

