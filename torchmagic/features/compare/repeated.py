"""A cell compared again in the same kernel: where a variant's 95% interval and the one its last run gave do
not meet, the report says so.

A run's interval is made over blocks of its own rounds, all inside the seconds it ran.  A machine whose speed
moves on a longer scale (a shared host's other tenants, the CPU's clocks) moves a ratio between runs by more
than one run can see: on the 2-core AVX512-BF16 EPYC, amp's speedup on BERT read 1.54x for a minute, 1.35-1.40x
for the next few and 1.55x again, and ``blocked_autorange``'s own interleaved estimates of 34 s each missed each
other's intervals in 4 to 35 of 45 pairs of runs, the magic's in 7 to 22 (benchmarks/compare_accuracy.py
--between-runs).  A user who runs the cell again and sees two "95% intervals" that miss each other is told why,
and how far apart they are, rather than left to doubt both.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from .result import CompareResult

_KEPT = 256  # (cell, variant, setting) entries kept per process: the oldest go first


@dataclass(frozen=True)
class _Seen:
    speedup: float
    ci: tuple[float, float]
    seconds: float  # the run's length
    at: float       # time.monotonic() when it ended
    model: Any      # a weak reference to the model it ran (an id is reused once its object is gone), or None


_LAST: dict[tuple, _Seen] = {}


def compared_again(result: CompareResult, code, model, what: str = "cell") -> list[str]:
    """Notes on the variants whose interval misses the one the last comparison of the same code (on the same
    model object, device, dtype and thread count) gave in this process; this run's intervals are kept for the
    next.  ``code``: what identifies it (a cell's text's key, a function's code object); ``what``: "cell" or
    "function", as the note names it."""
    notes, now = [], time.monotonic()
    ref = weakref.ref(model) if model is not None else None
    for v in result.variants[1:]:
        if v.speedup is None or v.ci is None:
            continue
        key = (code, result.device.label, v.name, v.dtype, torch.get_num_threads())
        last = _LAST.pop(key, None)
        same_model = last is not None and (last.model() if last.model is not None else None) is model
        if same_model and (v.ci[1] < last.ci[0] or last.ci[1] < v.ci[0]):
            notes.append(_missed(v.name, (v.speedup, v.ci), last, now, what))
        _LAST[key] = _Seen(v.speedup, v.ci, result.seconds, now, ref)
    while len(_LAST) > _KEPT:
        del _LAST[next(iter(_LAST))]
    return notes


def _missed(name: str, read: tuple, last: _Seen, now: float, what: str) -> str:
    speedup, (low, high) = read
    apart = max(speedup, last.speedup) / min(speedup, last.speedup) - 1
    return (f"{name} read {speedup:.3f}x (95% CI {low:.3f}-{high:.3f}x) here and {last.speedup:.3f}x "
            f"({last.ci[0]:.3f}-{last.ci[1]:.3f}x) when this {what} was last compared, {_ago(now - last.at)}: the "
            f"intervals do not meet. Each holds what the machine did during its own run (the last took "
            f"{last.seconds:.0f} s); if nothing the {what} uses changed, the machine's speed moved between the runs, "
            f"so on this machine a difference of {apart:.0%} is not settled by one run: compare the variants you "
            f"want to tell apart in the same run")


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"
