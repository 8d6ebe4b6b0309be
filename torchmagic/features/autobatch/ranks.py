"""``%%autobatch --ranks N``: the batch-size search run by every rank of a data-parallel job.

The cell runs once in each of N processes (core/ranks), as torchrun runs a script: it builds the
model, wraps it in DistributedDataParallel, defines the step.  The search itself (search.py) runs
here, in the notebook, and each of its trials is a request to every rank to run the step at that
size (worker.py): a size fits only if it fits on every rank, so a trial's peak is the largest of
the ranks' peaks, and its budget the least of theirs.

A rank that runs out of memory part-way through a step leaves the job broken: the ranks that did
not are blocked in a collective it will never join, and DDP's reducer is left mid-iteration.  So
the trial is decided as soon as one rank says it ran out, and every rank is started again from
the cell (and warmed up) before the next trial.

``%%autobatch --fresh`` (one rank unless --ranks N) starts the ranks again before every read instead:
each read is of the first steps of a job started for it, as a script's, and the notebook counts a
trial's reads with its neighbours' as a search in one process does (footprint.FootprintCount).
"""

from __future__ import annotations

import pickle
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ...core.devices import DeviceInfo
from ...core.interrupts import guards
from ...core.outcome import Outcome
from ...core.ranks import RankControl, RankFailed, RankOutput, RankProcesses, choose_backend, pickle_shared
from ...core.ranks.output import show_rank_line
from ...core.ranks.processes import threads_per_rank
from ...core.ranks.share import shared_note
from .build import SearchRecord, build_result
from .footprint import FootprintCount, read_until_agreed, varied_footprint_note
from .result import AutobatchResult, ThroughputPoint
from .options import AutobatchOptions, search_space
from .search import TRIAL_STEPS, Probe, search
from .worker import EXIT_NO_STEP

WORKER = "torchmagic.features.autobatch.worker"


class RanksUnsteady(RuntimeError):
    """Started again after running out of memory, a rank ran out at the smallest size."""


class StepMissing(RuntimeError):
    """The cell did not define the step it was said to."""


class _Trials:
    """Each trial asked of every rank; the ranks started again after one that ran out, and, with
    ``fresh``, before every read: each read is of a job's first steps."""

    def __init__(self, processes: RankProcesses, control: RankControl, smallest: int,
                 on_probe: Callable[[Probe], None], record: SearchRecord):
        self.processes, self.control, self.smallest, self.on_probe = processes, control, smallest, on_probe
        self.record = record  # the trials and restarts go in it
        # --fresh: each trial's reads, one per start, pooled with its neighbours' as in one process
        self.footprint = FootprintCount() if record.options.fresh else None
        self._broken = self._used = False

    def __call__(self, size: int) -> Probe:
        __tracebackhide__ = True  # noqa: F841
        probe = self._fresh(size) if self.footprint else self._ask(size)
        self.record.probes.append(probe)
        self.on_probe(probe)
        return probe

    def ready(self) -> None:
        """Ranks that can take a request: after one ran out of memory, every rank started again
        and warmed up (optimizer state, plans, caches), as at the start; with ``fresh``, ranks that
        ran no step yet."""
        __tracebackhide__ = True  # noqa: F841
        if not self._broken and not (self.footprint and self._used):
            return
        self.processes.restart()
        self.record.restarts += 1
        self._broken = self._used = False
        if self.footprint:
            return
        warm = self._ask(self.smallest)
        if not warm.ran:
            raise RanksUnsteady(f"started again after running out of memory, {warm.error} at the smallest "
                                f"size ({self.smallest}), which ran before: memory did not come back")

    def _fresh(self, size: int) -> Probe:
        """Reads of the first steps at ``size``, each in ranks started for it, until they agree (as
        many as a trial in one process reads); counted as there, with the neighbours' reads."""
        __tracebackhide__ = True  # noqa: F841
        probes = [self._ask(size, fresh=True)]

        def read_again() -> int | None:
            __tracebackhide__ = True  # noqa: F841
            probes.append(self._ask(size, fresh=True))
            return probes[-1].footprint_reads[0] if probes[-1].ran and probes[-1].footprint_reads else None

        first = probes[0]
        if not first.ran or not first.footprint_reads:
            return first  # out of memory, or nothing read apart from torch's allocations (CUDA)
        reads = read_until_agreed(read_again, self.footprint.runs_for(first.allocated_bytes), first.footprint_reads)
        if not probes[-1].ran:
            return probes[-1]  # a later start ran out: the size does not fit
        counted = self.footprint.counted(reads, first.allocated_bytes)
        return replace(first, peak_bytes=max(first.allocated_bytes or 0, counted), footprint_reads=reads,
                       seconds=statistics.median(p.seconds for p in probes))

    def _ask(self, size: int, fresh: bool = False) -> Probe:
        __tracebackhide__ = True  # noqa: F841
        self.ready()
        self._used = True
        replies = self.control.ask({"do": "probe", "size": size, "fresh": fresh},
                                   enough=lambda reply: not reply["ran"])
        ran_out = sorted((r for r in replies.values() if not r["ran"]), key=lambda r: r["rank"])
        if ran_out:
            self._broken = True
            first = ran_out[0]
            return Probe(size, None, False, seconds=first["seconds"], error=f"rank {first['rank']}: {first['error']}",
                         unallocated_bytes=first["unallocated_bytes"])
        ordered = [replies[rank] for rank in sorted(replies)]
        allocated = [r["allocated_bytes"] for r in ordered if r["allocated_bytes"] is not None]
        largest = max(ordered, key=lambda r: r["peak_bytes"])
        return Probe(size, largest["peak_bytes"], True, seconds=max(r["seconds"] for r in ordered),
                     allocated_bytes=max(allocated) if allocated else None,
                     rank_peaks_bytes=tuple(r["peak_bytes"] for r in ordered),
                     footprint_reads=tuple(largest["footprint_reads"]) if largest.get("footprint_reads") else None)


@dataclass(frozen=True)
class RankJob:
    """The user's job on ``ranks`` processes: ``code`` runs once in each rank and defines ``step`` (a
    callable taking the batch size), or ``expression`` uses ``BS``; ``shared``: the notebook's values
    every rank gets; ``gpus``: the GPUs NCCL may use (0: gloo)."""

    code: str
    ranks: int
    step: str | None = None
    expression: str | None = None
    shared: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    gpus: int = 0


@guards
def run_autobatch_ranks(job: RankJob, options: AutobatchOptions, *,
                        on_output: Callable[[int, str, bool], None] | None = None,
                        on_probe: Callable[[Probe], None] | None = None, label: str = "autobatch"
                        ) -> Outcome[AutobatchResult]:
    """Search the largest per-rank batch size of ``job``.  A Ctrl-C stops every rank and ends the search
    with what ran (the outcome's result) and the interrupt."""
    __tracebackhide__ = True  # noqa: F841
    ranks, shared = job.ranks, job.shared
    backend = choose_backend(ranks, job.backend, job.gpus)
    blob = pickle_shared(shared)
    space = search_space(options)

    def payload(out_dir: str) -> bytes:
        return pickle.dumps({"code": job.code, "step": job.step, "expression": job.expression, "shared": blob,
                             "backend": backend})

    threads = threads_per_rank(ranks)
    record = SearchRecord(label, options, device=_ranks_device(backend, ranks), ranks=ranks)
    with RankProcesses(WORKER, payload, ranks, threads, control=True) as processes:
        control = RankControl(processes, RankOutput(processes.logs, on_output or show_rank_line))
        trials = _Trials(processes, control, space.smallest, on_probe or (lambda probe: None), record)
        try:
            _search(trials, control, options, space, record)
        except KeyboardInterrupt as exc:  # what ran so far goes with it, once every rank has stopped
            return Outcome(build_result(record) if record.probes else None, error=exc)
        except RankFailed as exc:
            if exc.exitcode == EXIT_NO_STEP:
                raise StepMissing(exc.said) from None
            raise
        control.output.poll(final=True)
    record.notes.insert(0, f"{ranks} rank{'s' if ranks > 1 else ''} with {backend}, {threads} thread(s) each; "
                        f"{shared_note(shared, blob)}{_restarts_note(record)}")
    return Outcome(build_result(record))


def _ranks_device(backend: str, ranks: int) -> DeviceInfo:
    """The ranks' devices, until the budget's reply names the one it was read on: each rank's own GPU
    under NCCL, the CPU under gloo (rank_device's choice)."""
    kind = "cuda" if backend == "nccl" else "cpu"
    return DeviceInfo(kind, kind, f"{ranks} ranks")


def _restarts_note(record: SearchRecord) -> str:
    if record.options.fresh:
        return (f"; --fresh: each read of a trial was of the first {TRIAL_STEPS} steps of ranks started for it, "
                f"as a script's ({record.restarts + 1} starts)")
    return (f"; every rank was started again {record.restarts} time(s), after one ran out of memory"
            if record.restarts else "")


def _search(trials: _Trials, control: RankControl, options: AutobatchOptions, space, record: SearchRecord) -> None:
    """Fills ``record`` as the search goes: a Ctrl-C leaves it with what ran."""
    __tracebackhide__ = True  # noqa: F841
    warm = trials(space.smallest)  # as in one process: the first step creates what every step reuses
    if not warm.ran:  # no budget is asked of ranks one of which is stuck in a collective: no answer either way
        record.how = "not read: nothing ran"
        record.reason = f"the smallest size ({space.smallest}) runs out of memory on {warm.error.split(':')[0]}"
        return
    budgets = sorted(control.ask({"do": "budget", "budget": options.budget}).values(),
                     key=lambda r: (r["bytes"], r["rank"]))
    least = budgets[0]
    record.budget, record.device = least["bytes"], DeviceInfo(**least["device"])
    record.how = least["how"] + (f" (rank {least['rank']}'s, the least of the {record.ranks} ranks')" if not all(
        b["bytes"] == record.budget for b in budgets) else "")
    record.outcome = search(trials, record.limit, space, None, warm=warm)  # the warm-up is the first trial
    record.reason = record.outcome.reason
    record.notes += least["notes"]
    record.notes.append("Fake-tensor estimates are not used with --ranks: a trial is a real step on every rank.")
    record.notes += varied_footprint_note(record.outcome.probes, options.fresh)
    if options.throughput and record.outcome.batch_size:
        trials.ready()
        record.throughput = _throughput(control, record.outcome.batch_size, space, record.ranks)


def _throughput(control: RankControl, answer: int, space, ranks: int) -> list[ThroughputPoint]:
    """Samples/s over all ranks: a step takes as long as its slowest rank (the gradients' all-reduce
    waits for it), so each size's time is the largest of the ranks' medians."""
    replies = control.ask({"do": "throughput", "answer": answer,
                           "space": [space.min_size, space.max_size, space.multiple_of]})
    slowest: dict[int, float] = {}
    for reply in replies.values():
        for size, seconds in reply["points"]:
            slowest[size] = max(slowest.get(size, 0.0), seconds)
    return [ThroughputPoint(size, size * ranks / seconds, seconds) for size, seconds in sorted(slowest.items())]
