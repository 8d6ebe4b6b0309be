"""The CUDA caching allocator's own history of allocations, each with the Python stack that made it
(``torch.cuda.memory._record_memory_history``), read for ``%%torchprofile --memory``.

The profiler's allocation events give each allocation's op, and Python frames only where its tracer
ran, with the line each function starts at.  The allocator's history gives the line that allocated.
Recording is the user's setting as much as ours: where it is already on (their snapshot viewer's
history), it is left on, with their settings and entries, and only entries made during the steps are
read; where it is off, it is turned on for the steps and off again after.  Every call is guarded: a torch without it, or a failure reading it, leaves the profiler's
events to do the work.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

from ..interrupts import deliver_pending, uninterruptible

# Entries kept at most while we record (a ring buffer: the oldest go first, and allocations are matched
# from the last); each holds a Python stack (torch says several KB) and costs about 2 µs to record.
MAX_ENTRIES = 50_000
SKIPPED = ["free_requested", "free_completed", "segment_alloc", "segment_free", "snapshot"]  # torch's documented names


@dataclass(frozen=True)
class HistoryAlloc:
    """One allocation the allocator recorded: where, how big, and the Python frames that made it,
    innermost first, each named as torch's tracer names a frame: ``file(line): function``."""

    addr: int
    size: int
    frames: tuple[str, ...]


@dataclass
class AllocationHistory:
    """Filled when its ``with`` block ends: the allocations per device label ("cuda:0"), in order."""

    allocations: dict[str, list[HistoryAlloc]] = field(default_factory=dict)
    theirs: bool = False   # the user was recording already: their settings were kept
    note: str | None = None


@contextlib.contextmanager
def cuda_allocation_history(memory=None, is_recording=None):
    """Record the allocator's history within the block (``memory``: torch.cuda.memory, and whether it
    records already: torch's own, or fakes)."""
    memory = memory or torch.cuda.memory
    history = AllocationHistory()
    started_us = time.time_ns() // 1000  # the allocator stamps entries in µs on the same wall clock
    try:
        history.theirs = bool((is_recording or torch._C._cuda_isHistoryEnabled)())
        if not history.theirs:
            _start(memory)
        recording = True
    except Exception as exc:  # noqa: BLE001  (a torch without it, no CUDA: the profiler's events remain)
        history.note = f"CUDA's allocator history could not be recorded ({exc}); stacks come from the profiler."
        recording = False
    try:
        yield history
    finally:
        if recording:
            _read_and_stop(memory, history, started_us)


@uninterruptible
def _read_and_stop(memory, history: AllocationHistory, started_us: int) -> None:
    """Read what the allocator recorded, then stop the recording if it was ours."""
    try:
        traces = memory._snapshot()["device_traces"]
        since = started_us if history.theirs else None  # ours: all of it, cleared when we began
        history.allocations = {f"cuda:{index}": _allocations(entries, since)
                               for index, entries in enumerate(traces) if entries}
    except Exception as exc:  # noqa: BLE001
        history.note = f"CUDA's allocator history could not be read ({exc}); stacks come from the profiler."
    finally:
        if not history.theirs:
            _stop(memory, history)
    deliver_pending()


def _start(memory) -> None:
    settings = dict(context="alloc", stacks="python", max_entries=MAX_ENTRIES, clear_history=True)
    try:  # allocations only: frees and segments would take most of the entries (a torch without the option: all)
        memory._record_memory_history("all", **settings, skip_actions=SKIPPED)
    except TypeError:
        memory._record_memory_history("all", **settings)


def _stop(memory, history: AllocationHistory) -> None:
    try:
        memory._record_memory_history(None)
    except Exception as exc:  # noqa: BLE001  (never mask the cell's own error with ours)
        history.note = f"CUDA's allocator history could not be turned off again ({exc})."


def _allocations(entries: list[dict], since_us: int | None) -> list[HistoryAlloc]:
    return [HistoryAlloc(e["addr"], e["size"], tuple(f"{f['filename']}({f['line']}): {f['name']}"
                                                     for f in e.get("frames", ())))
            for e in entries
            if e.get("action") == "alloc" and (since_us is None or e.get("time_us", since_us) >= since_us)]
