"""The ``%autobatch`` engine in the notebook's process: run the user's step at the sizes the search
(search.py) chooses, each trial from the user's state (trial.py), and build the result from what it
did (build.py).  The user's model, optimizer and random state are put back afterwards, and memory
returns to where it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...core.devices import Device, choose_device
from ...core.devices.profiler import ensure_profiler_free
from ...core.gc_pause import heap_set_aside
from ...core.interrupts import deliver_pending, guards, uninterruptible
from ...core.outcome import Outcome
from ...core.render.format import fmt_bytes
from ...core.state import Snapshot, objects_used_by, referenced_values
from .build import SearchRecord, build_result
from .estimate import fake_estimator
from .footprint import FootprintCount, varied_footprint_note
from .result import AutobatchResult
from .options import AutobatchOptions, search_space
from .leak import Leak, LeakFound, LeakWatch
from .search import Probe, SearchOutcome, SearchSpace, fits, search
from .trial import measure_throughput, release, run_trial, starting_over

CPU_DEFAULT_BUDGET = 0.5   # of available RAM: the rest of the notebook (and the OS) needs some
DEVICE_DEFAULT_BUDGET = 0.9  # of the accelerator's memory


def resolve_budget(budget: float | None, device: Device) -> tuple[int, str]:
    """Bytes the step may add on top of what is in use now, and how that number was chosen.

    A fraction is of the device's total memory (CPU: of the RAM available now); whatever this
    and other processes already use comes off it.
    """
    free, total = device.memory_capacity()
    if not device.is_accelerator:
        fraction = CPU_DEFAULT_BUDGET if budget is None else budget
        if fraction <= 1:
            return int(free * fraction), f"{fraction:.0%} of the {_gib(free)} of RAM available"
        return int(budget), "as given"
    fraction = DEVICE_DEFAULT_BUDGET if budget is None else budget
    used = total - free
    if fraction <= 1:
        return max(int(total * fraction) - used, 0), (f"{fraction:.0%} of {_gib(total)}, less the "
                                                        f"{_gib(used)} already in use")
    return max(int(budget) - used, 0), f"{_gib(int(budget))} as given, less the {_gib(used)} already in use"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def objects_to_restore(step: Callable[[int], Any], values: list[Any] | None = None) -> list[Any]:
    """What probing can change, put back afterwards: the modules, optimizers and schedulers reached
    from the values the step uses (``values``, else its closure and the globals it names).  The
    magic and the API both choose this way."""
    return objects_used_by(referenced_values(step) if values is None else values)


@guards
def run_autobatch(step: Callable[[int], Any], options: AutobatchOptions = AutobatchOptions(), *,
                  state: list[Any] = (), device: Device | None = None, label: str = "autobatch",
                  on_probe: Callable[[Probe], None] | None = None) -> Outcome[AutobatchResult]:
    """Search the largest batch size ``step(batch_size)`` runs with under the budget.

    ``state`` lists the modules and optimizers the step changes; they are restored after the
    search (and if it fails).  The step's exceptions other than running out of memory propagate;
    a Ctrl-C ends the search with what ran so far (the outcome's result, once the budget was read)
    and the interrupt as its error.  ``on_probe`` hears of every run as it ends (a progress display).
    """
    __tracebackhide__ = True  # noqa: F841
    ensure_profiler_free()
    engine = LocalSearch(step, options, device or choose_device(), list(state), on_probe or (lambda probe: None))
    record = SearchRecord(label, options, device=engine.device.describe())
    with heap_set_aside():  # the collections after failed trials and at the end scan only what the search made
        release(engine.device)
        record.memory_before = engine.device.memory_in_use()
        try:
            engine.run(record)
        except KeyboardInterrupt as exc:  # what ran so far (once the budget is read) goes with it
            return Outcome(build_result(record) if record.how is not None else None, error=exc)
        finally:
            _put_back(engine.snapshot, engine.device)
    record.memory_after = engine.device.memory_in_use()
    return Outcome(build_result(record))


class LocalSearch:
    """The search's trials in this process, each from the user's state."""

    def __init__(self, step: Callable[[int], Any], options: AutobatchOptions, device: Device, state: list[Any],
                 on_probe: Callable[[Probe], None]):
        self.step, self.options, self.device, self.state, self.on_probe = step, options, device, state, on_probe
        self.space = search_space(options)
        self.snapshot = Snapshot(state, device)
        self.reset = starting_over(self.snapshot, device)
        self.footprint = FootprintCount()  # what each trial counts, with its neighbours' reads
        self.leaks = LeakWatch(device)      # what each run leaves held, by size
        self.record: SearchRecord | None = None

    def trial(self, size: int) -> Probe:
        """One trial; where its runs show the step keeping more memory after every call, it is the last."""
        __tracebackhide__ = True  # noqa: F841
        probe = run_trial(self.step, size, self.device, self.reset, self.footprint, self.leaks)
        if self.leaks.leak is not None:
            probe = replace(probe, leaked=True)
        self.record.probes.append(probe)
        self.on_probe(probe)
        if self.leaks.leak is not None:
            raise LeakFound(self.leaks.leak)
        return probe

    def run(self, record: SearchRecord) -> None:
        """Fills ``record`` as the search goes: a Ctrl-C leaves it with what ran.  A leak ends it where
        it was seen: each further trial would hold more of the budget, and its figures would mean less."""
        __tracebackhide__ = True  # noqa: F841
        self.record = record
        try:
            self._search(record)
        except LeakFound as found:
            self._stopped_at(found.leak, record)

    def _search(self, record: SearchRecord) -> None:
        __tracebackhide__ = True  # noqa: F841
        # The first trial, at the smallest size, also makes what a process makes once and keeps (cuBLAS
        # and cuDNN handles and workspaces, lazy modules): the budget is what is left after it.
        warm = self.trial(self.space.smallest)
        record.budget, record.how = resolve_budget(self.options.budget, self.device)
        if not warm.ran:
            record.reason = f"the smallest size ({self.space.smallest}) runs out of memory"
            return
        estimate = (fake_estimator(self.step, self.state, lambda: Snapshot(self.state, self.device))
                    if self.options.estimate else None)
        record.outcome = search(self.trial, record.limit, self.space, estimate,
                                footprint_scales=self.device.footprint_scales, warm=warm)
        record.notes = _notes(record.outcome, record.budget, self.state, self.device)
        record.reason = record.outcome.reason
        if self.device.is_accelerator and record.outcome.batch_size is not None:
            self._verify_again(record, estimate)
            record.reason = record.outcome.reason
        if self.options.throughput and record.outcome.batch_size:
            try:
                record.throughput = measure_throughput(self.step, record.outcome.batch_size, self.space, self.device)
            except KeyboardInterrupt:  # the answer stands; only its throughput is missing
                record.notes.append("interrupted while measuring throughput: the answer above is complete")
                raise

    def _stopped_at(self, leak: Leak, record: SearchRecord) -> None:
        """The search ended by a leak: its answer is the largest size that ran under the limit until then."""
        if record.how is None:  # seen in the first trial, before the budget was read
            record.budget, record.how = resolve_budget(self.options.budget, self.device)
        verified = [p.batch_size for p in record.probes if fits(p, record.limit)]
        record.leak = leak
        record.reason = (f"the memory the step holds grew after every call at batch {leak.batch_size}, "
                         "so the search stopped there")
        record.outcome = SearchOutcome(max(verified, default=None), record.limit, None, probes=list(record.probes),
                                       reason=record.reason)
        record.notes = _notes(record.outcome, record.budget, self.state, self.device)

    def _verify_again(self, record: SearchRecord, estimate) -> None:
        """On a GPU the answer runs once more after every other trial, out-of-memory ones included, from
        the state training starts in (the user's weights, the cache emptied; what the trials left behind,
        cuBLAS and cuDNN workspaces among it, still held).  Where it no longer fits, the search runs again
        below it, in that state, and its answer stands."""
        __tracebackhide__ = True  # noqa: F841
        outcome, limit = record.outcome, record.limit
        answer = outcome.batch_size
        again = self.trial(answer)
        outcome.probes.append(again)
        if fits(again, limit):
            return
        read = "ran out of memory" if not again.ran else f"peaked at {fmt_bytes(again.peak_bytes)}, over the limit"
        outcome.batch_size, record.reason = None, ""  # no answer, unless the search below ends (a Ctrl-C: none)
        below = self.space.round_down(answer - 1)
        if below < self.space.smallest:
            outcome.reason = f"{answer}, the only size that fit, no longer fits"
        else:
            second = search(self.trial, limit, SearchSpace(self.space.min_size, below, self.space.multiple_of), estimate,
                            footprint_scales=self.device.footprint_scales)
            outcome.probes += second.probes
            outcome.batch_size, outcome.law = second.batch_size, second.law or outcome.law
            outcome.reason = f"{second.reason}, searched again after {answer}, the first answer, no longer fit"
        record.notes.append(f"Run again after the search, from the state training starts in, batch {answer} {read}: "
                            "what the trials left behind (fragmentation, workspaces) changed what fits, so the search "
                            "ran again below it.")


FRAGMENTATION_SHARE = 0.1  # unallocated at an OOM, as a share of the budget, worth a note


def _notes(outcome, budget: int, state, device: Device) -> list[str]:
    notes = [note for note in (device.choice_note(),) if note]
    gaps = [p.unallocated_bytes for p in (outcome.probes if outcome else []) if p.unallocated_bytes]
    if gaps and max(gaps) > FRAGMENTATION_SHARE * budget:
        notes.append(f"When a run ran out of memory, {max(gaps) / 2**20:.0f} MiB were reserved by the caching "
                     "allocator but unallocated (fragmentation): PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, "
                     "set before CUDA starts, can let a larger batch fit.")
    notes += varied_footprint_note(outcome.probes if outcome else [])
    if any(type(o).__name__ == "OptimizedModule" for o in state):
        notes.append("A torch.compile'd module: each new batch size can trigger a recompile (after the first, "
                     "the batch dimension is marked dynamic), so trial times include compiling; more than 8 "
                     "recompiles fall back to eager, whose memory can differ from the compiled step's.")
    if device.autotunes_per_shape:
        notes.append("torch.backends.cudnn.benchmark is on: cuDNN may pick a different algorithm, with a "
                     "different workspace, for each size; leave headroom (--margin).")
    return notes


@uninterruptible
def _put_back(snapshot: Snapshot, device: Device) -> None:
    """The user's weights, optimizer and generators, then the memory the trials left cached."""
    snapshot.restore()
    release(device)
    deliver_pending()
