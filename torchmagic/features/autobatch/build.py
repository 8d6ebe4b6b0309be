"""An ``AutobatchResult`` built once, from what a search did: every engine (one process, ranks) fills
a ``SearchRecord`` as it goes, and the result is built from it when the search ends, or stops."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from ...core.devices import DeviceInfo
from .leak import Leak
from .options import AutobatchOptions
from .result import AutobatchResult, ThroughputPoint, Trial
from .search import Probe, SearchOutcome, fits


@dataclass
class SearchRecord:
    """What one search did so far."""

    label: str
    options: AutobatchOptions
    device: DeviceInfo                       # the budgeted device's description
    started: float = field(default_factory=time.perf_counter)
    budget: int = 0
    how: str | None = None                   # how the budget was chosen; None until it is
    probes: list[Probe] = field(default_factory=list)
    outcome: SearchOutcome | None = None     # None until the search ends
    reason: str = ""                         # where it ended; empty: it stopped before it did
    notes: list[str] = field(default_factory=list)
    throughput: list[ThroughputPoint] = field(default_factory=list)
    ranks: int = 1                           # with ranks, sizes are per rank and the target batch global
    restarts: int = 0
    memory_before: int | None = None
    memory_after: int | None = None
    leak: Leak | None = None                 # where the step's held memory grew call after call

    @property
    def limit(self) -> int:
        return self.options.limit(self.budget)


def build_result(record: SearchRecord) -> AutobatchResult:
    outcome, limit = record.outcome, record.limit
    law = outcome.law if outcome is not None else None
    size = outcome.batch_size if outcome is not None else None
    target = -(-record.options.target_batch // record.ranks) if record.options.target_batch else None
    accumulation, micro = accumulation_steps(target, size, record.options.multiple_of)
    rate = {p.batch_size: p.samples_per_s for p in record.throughput}
    trials = [Trial(p.batch_size, p.peak_bytes, ran=p.ran and not p.estimated, ok=fits(p, limit), seconds=p.seconds,
                    estimated=p.estimated, error=p.error, allocated_bytes=p.allocated_bytes,
                    rank_peaks_bytes=p.rank_peaks_bytes, footprint_reads=p.footprint_reads, leaked=p.leaked)
              for p in (outcome.probes if outcome is not None else record.probes)]
    return AutobatchResult(
        label=record.label, device=record.device, batch_size=size, ranks=record.ranks,
        budget_bytes=record.budget, limit_bytes=limit, budget_source=record.how or "not read",
        fixed_bytes=law.fixed_bytes if law else None, per_sample_bytes=law.per_sample_bytes if law else None,
        trials=[replace(t, samples_per_s=rate.get(t.batch_size)) if not t.estimated else t for t in trials],
        accumulation_steps=accumulation, micro_batch=micro,
        reason=record.reason or _stopped(record, limit), options=record.options,
        seconds=time.perf_counter() - record.started, memory_before_bytes=record.memory_before,
        memory_after_bytes=record.memory_after, throughput=list(record.throughput),
        prediction=outcome.prediction if outcome is not None else None, notes=list(record.notes),
        restarts=record.restarts, leak=record.leak,
    )


def _stopped(record: SearchRecord, limit: int) -> str:
    fitted = [p.batch_size for p in record.probes if fits(p, limit)]
    return (f"interrupted after {len(record.probes)} trials, before the search ended: no answer"
            + (f" (the largest that ran under the limit: {max(fitted)}; larger may fit)" if fitted else ""))


def accumulation_steps(target: int | None, size: int | None, multiple_of: int) -> tuple[int | None, int | None]:
    """Accumulation steps and the micro-batch that reach ``target`` with micro-batches of at most
    ``size``: equal micro-batches that sum to the target exactly where a few more steps allow it
    (256 with at most 49: 8 steps of 32, not 6 of 43, which make 258), multiples of ``multiple_of``
    where they can be; else the fewest steps, evenly spread (the effective batch is then said)."""
    if not target or not size:
        return None, None
    fewest = math.ceil(target / size)
    exact = [k for k in range(fewest, 2 * fewest + 1) if target % k == 0]
    aligned = [k for k in exact if (target // k) % multiple_of == 0]
    steps = (aligned or exact or [fewest])[0]
    return steps, math.ceil(target / steps)
