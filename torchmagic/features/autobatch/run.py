"""The ``%autobatch`` engine: run the user's step at chosen batch sizes, measure each run's
peak, and let :mod:`.batchsearch` decide the sizes.  The user's model, optimizer and random
state are put back afterwards, and memory returns to where it was.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ...core.devices import Device, choose_device, is_out_of_memory
from ...core.devices.profiler import ensure_profiler_free
from ...core.interrupts import deliver_pending, guards, uninterruptible
from ...core.limits import SettingError, describe_error
from ...core.measure import timed_call
from ...core.state import Snapshot, objects_used_by, referenced_values
from .estimate import fake_estimator
from .footprint import FootprintCount, agree, read_footprints, varied_footprint_note
from .result import TRIAL_STEPS, AutobatchResult, ThroughputPoint, Trial
from .search import Probe, SearchSpace, fits, search

CPU_DEFAULT_BUDGET = 0.5   # of available RAM: the rest of the notebook (and the OS) needs some
DEVICE_DEFAULT_BUDGET = 0.9  # of the accelerator's memory


@dataclass(frozen=True)
class AutobatchOptions:
    budget: float | None = None   # bytes (> 1) or a fraction of memory (<= 1); None: the default
    min: int = 1                  # batch sizes considered: min to max, multiples of multiple_of
    max: int = 65536
    multiple_of: int = 1
    margin: float = 0.1           # headroom kept below the budget
    target_batch: int | None = None
    throughput: bool = False      # also time samples/s at the answer and smaller verified sizes
    estimate: bool = True         # fit on fake-tensor estimates where the step allows it

    def __post_init__(self):
        if self.budget is not None and not 0 < self.budget < math.inf:
            raise SettingError("budget", f"must be a positive number (bytes, or a fraction of memory), got {self.budget}")
        if not 0 <= self.margin < 1:
            raise SettingError("margin", f"must be in [0, 1), got {self.margin}")
        if self.target_batch is not None and self.target_batch < 1:
            raise SettingError("target_batch", f"must be at least 1, got {self.target_batch}")
        search_space(self)  # validates the range

    def to_dict(self) -> dict:
        return asdict(self)


def search_space(options: AutobatchOptions) -> SearchSpace:
    return SearchSpace(options.min, options.max, options.multiple_of)


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
                  on_probe: Callable[[Probe], None] | None = None) -> AutobatchResult:
    """Search the largest batch size ``step(batch_size)`` runs with under the budget.

    ``state`` lists the modules and optimizers the step changes; they are restored after the
    search (and if it fails).  The step's exceptions other than running out of memory propagate.
    ``on_probe`` hears of every run as it ends (a progress display).
    """
    __tracebackhide__ = True  # noqa: F841
    ensure_profiler_free()
    device = device or choose_device()
    space = search_space(options)
    snapshot = Snapshot(state, device)
    _release(device)
    before = device.memory_in_use()
    started = time.perf_counter()
    try:
        result = _search(step, options, space, device, label, before, started, on_probe or (lambda probe: None),
                         state, snapshot)
    finally:
        _put_back(snapshot, device)
    result.memory_after_bytes = device.memory_in_use()
    return result


def _search(step, options, space, device, label, before, started, on_probe, state,
            snapshot: Snapshot) -> AutobatchResult:
    __tracebackhide__ = True  # noqa: F841

    probes: list[Probe] = []

    from_users_state = starting_over(snapshot, device)
    footprint = FootprintCount()

    def probe(size: int) -> Probe:
        __tracebackhide__ = True  # noqa: F841
        result = _probe(step, size, device, from_users_state, footprint)
        probes.append(result)
        on_probe(result)
        return result

    # The first trial, at the smallest size, also makes what a process makes once and keeps (cuBLAS
    # and cuDNN handles and workspaces, lazy modules): the budget is what is left after it.
    warm = probe(space.smallest)
    budget, how = resolve_budget(options.budget, device)
    try:
        return _search_from(warm, budget, how, probe, step, options, space, device, label, before, started, state)
    except KeyboardInterrupt as exc:  # what ran so far goes with it: the magic shows it
        if not hasattr(exc, "torchmagic_result"):
            exc.torchmagic_result = _result(label, device.describe(), options, budget, how, None, probes, before, started,
                                            reason=_interrupted_reason(probes, int(budget * (1 - options.margin))))
        raise


def _interrupted_reason(probes: list[Probe], limit: int) -> str:
    fitted = [p.batch_size for p in probes if fits(p, limit)]
    return (f"interrupted after {len(probes)} trials, before the search ended: no answer"
            + (f" (the largest that ran under the limit: {max(fitted)}; larger may fit)" if fitted else ""))


def _search_from(warm, budget, how, probe, step, options, space, device, label, before, started,
                 state) -> AutobatchResult:
    __tracebackhide__ = True  # noqa: F841
    if not warm.ran:
        return _result(label, device.describe(), options, budget, how, None, [warm], before, started,
                       reason=f"the smallest size ({space.smallest}) runs out of memory")
    limit = int(budget * (1 - options.margin))
    estimate = fake_estimator(step, list(state), lambda: Snapshot(state, device)) if options.estimate else None
    outcome = search(probe, limit, space, estimate, footprint_scales=device.footprint_scales, warm=warm)
    result = _result(label, device.describe(), options, budget, how, outcome, outcome.probes, before, started,
                     reason=outcome.reason)
    result.notes = _notes(outcome, budget, state, device)
    if options.throughput and result.batch_size:
        try:
            result.throughput = _throughput(step, result.batch_size, space, device)
        except KeyboardInterrupt as exc:  # the answer stands; only its throughput is missing
            result.notes.append("interrupted while measuring throughput: the answer above is complete")
            exc.torchmagic_result = result
            raise
        rate = {p.batch_size: p.samples_per_s for p in result.throughput}
        result.trials = [dataclasses.replace(t, samples_per_s=rate.get(t.batch_size)) if not t.estimated else t
                         for t in result.trials]
        result.seconds = time.perf_counter() - started
    return result


THROUGHPUT_REPEATS = 3


def _throughput(step, answer: int, space: SearchSpace, device: Device) -> list[ThroughputPoint]:
    """Samples/s at the answer and at halvings of it, un-profiled: the median of a few timed
    steps after one untimed one.  Only sizes at or below the verified answer are run."""
    sizes = []
    size = answer
    while size >= space.smallest and len(sizes) < 6:
        sizes.append(size)
        size = space.round_down(size / 2)
    points = []
    for size in sorted(set(sizes)):
        step(size)
        times = [timed_call(lambda: step(size), device)[1] for _ in range(THROUGHPUT_REPEATS)]
        median = statistics.median(times)
        points.append(ThroughputPoint(size, size / median, median))
    _release(device)
    return points


def starting_over(snapshot: Snapshot, device: Device) -> Callable[..., None]:
    """``reset(collect=True)``: back to where the user's training starts, after each trial's runs:
    their weights and optimizer state (often none yet: a trial's first step then creates it, as the
    first training step will), and memory released."""
    def reset(collect: bool = True) -> None:
        snapshot.restore()
        _release(device, collect)
    return reset


def _probe(step: Callable[[int], Any], size: int, device: Device,
           reset: Callable[..., None] | None = None, footprint: FootprintCount | None = None) -> Probe:
    """One trial: ``TRIAL_STEPS`` steps at ``size`` and their peak above the start.  ``reset(collect)``
    puts the state back after each run (default: only memory is released).  ``footprint``: how many
    runs read the footprint and what it counts, with the reads of the search's trials so far."""
    __tracebackhide__ = True  # noqa: F841
    reset = reset or (lambda collect=True: _release(device, collect))
    error = unallocated = None
    start = time.perf_counter()
    with device.peak_scope() as reading:
        try:
            for _ in range(TRIAL_STEPS):
                step(size)
            device.synchronize()
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            error = describe_error(exc, width=200)
            unallocated = _unallocated(device)
    seconds = (time.perf_counter() - start) / TRIAL_STEPS
    # Out here, past the except block, the failed step's frames and the tensors they hold are
    # unreachable; a collection frees what sits in reference cycles.  A step that succeeded
    # freed its tensors by reference counting (a full collection costs ~0.15 s with torch loaded).
    reset(collect=error is not None)
    if error is not None:
        return Probe(size, None, False, seconds=seconds, error=error, unallocated_bytes=unallocated)
    # what counts against the budget: torch's allocations, or all the process took if that is more
    # (CPU: resident memory, for Python objects, oneDNN scratch and malloc's pages; CUDA: reserved)
    footprint = footprint or FootprintCount()
    reads = read_footprints(step, size, device, reset, footprint.runs_for(reading.peak_bytes))
    counted = footprint.counted(reads, reading.peak_bytes) if reads else reading.footprint_bytes
    peak = max(reading.peak_bytes, counted or 0)
    shown = reads and (not agree(reads) or counted > max(reads))  # the reads behind a peak they do not show
    return Probe(size, peak, True, seconds=seconds, allocated_bytes=reading.peak_bytes,
                 footprint_reads=reads if shown else None)


def _unallocated(device: Device) -> int | None:
    """What the caching allocator held but could not use when the step ran out: the number
    PyTorch's own OOM message reports as "reserved but unallocated"."""
    reserved, allocated = device.memory_reserved(), device.memory_allocated()
    return None if reserved is None or allocated is None else max(reserved - allocated, 0)


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
    _release(device)
    deliver_pending()


def _release(device: Device, collect: bool = True) -> None:
    if collect:
        gc.collect()
    device.empty_cache()  # each trial starts from an empty cache: no fragmentation carried over


def _accumulation(target: int | None, size: int | None, multiple_of: int) -> tuple[int | None, int | None]:
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


def _result(label, device, options, budget, how, outcome, probes, before, started, reason,
            ranks: int = 1) -> AutobatchResult:
    """``device``: its description; with ``ranks``, the target batch is global, split over them."""
    law = outcome.law if outcome is not None else None
    size = outcome.batch_size if outcome is not None else None
    target = -(-options.target_batch // ranks) if options.target_batch else None
    accumulation, micro = _accumulation(target, size, options.multiple_of)
    limit = int(budget * (1 - options.margin))
    return AutobatchResult(
        prediction=outcome.prediction if outcome is not None else None,
        label=label, device=device, batch_size=size, ranks=ranks,
        budget_bytes=budget, limit_bytes=limit, budget_source=how,
        fixed_bytes=law.fixed_bytes if law else None,
        per_sample_bytes=law.per_sample_bytes if law else None,
        trials=[Trial(p.batch_size, p.peak_bytes, ran=p.ran and not p.estimated, ok=fits(p, limit),
                      seconds=p.seconds, estimated=p.estimated, error=p.error, allocated_bytes=p.allocated_bytes,
                      rank_peaks_bytes=p.rank_peaks_bytes, footprint_reads=p.footprint_reads)
                for p in probes],
        accumulation_steps=accumulation, micro_batch=micro, reason=reason, options=options.to_dict(),
        seconds=time.perf_counter() - started,
        memory_before_bytes=before,
    )
