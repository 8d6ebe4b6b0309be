"""Tune a DataLoader: time the loader alone under other worker settings, say which feeds fastest.

Each setting gets a fresh DataLoader built from the user's parts (dataset, batch sampler or
batch size, collate function, worker init), so the user's loader is never iterated.  A pass
times the first batch on its own (worker start-up is a real cost, paid every epoch unless the
workers persist) and then the steady state, in batches per second.  Settings are measured in
interleaved rounds, and the speedup over the loader's current settings gets a 95% CI.
Every worker process started is shut down before the function returns.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ...core.devices import Device, choose_device
from ...core.expectations import Expectation
from ...core.interrupts import deliver_pending, guards, uninterruptible
from ...core.limits import SettingError, check_count, check_seconds, check_workers, describe_error
from ...core.measure import min_pairs, paired_ratio, summarize
from ...core.outcome import Outcome
from ...core.state import Generators, Snapshot, objects_used_by, referenced_values
from .cut_off import free_cut_off_batch, shared_memory_fds
from .result import DATALOADER_DEFAULTS, LoaderRow, LoaderSettings, LoaderTuneResult

WORKER_TIMEOUT_S = 120  # a worker that sends nothing for this long is taken as hung
MIN_BATCHES = 3         # a time-bound pass still times at least this many batches
SHORT_EPOCH_BUFFERS = 20  # an epoch shorter than this many prefetch buffers is short: its refill shows
EPOCH_CAP = 4           # a pass runs on to a short epoch's next start unless that takes this many times --seconds
EXIT_WAIT_S = 5         # a worker or queue thread told to end has this long to do so
MIN_PAIRED_ROUNDS = min_pairs()  # 6: fewer paired passes cannot give a 95% interval
_END = object()


@dataclass(frozen=True)
class LoaderTuneOptions:
    workers: tuple[int, ...] | None = None  # default: 0, 1, 2, 4, ... up to the CPU count
    batches: int | None = None              # batches timed per pass; default: as many as fit in ``seconds``
    seconds: float = 0.5                    # a pass times at least this long (and MIN_BATCHES batches)
    rounds: int = MIN_PAIRED_ROUNDS         # passes per setting, interleaved
    expect: Expectation | None = None       # a finding's predicted speedup of the change

    def __post_init__(self):
        if self.workers is not None and (not self.workers or any(w < 0 for w in self.workers)):
            raise SettingError("workers", "takes worker counts such as 0,1,2,4 (0 or more)")
        check_workers(self.workers)
        if self.batches is not None and self.batches < 1:
            raise SettingError("batches", "must be at least 1")
        check_count("batches", self.batches)
        if not self.seconds > 0:
            raise SettingError("seconds", "must be positive")
        check_seconds("seconds", self.seconds)
        if self.rounds < 2:
            raise SettingError("rounds", "must be at least 2 (a confidence interval needs more than one)")
        check_count("rounds", self.rounds)


def default_workers(cpus: int | None = None) -> tuple[int, ...]:
    cpus = cpus or os.cpu_count() or 1
    counts = {0, cpus}
    n = 1
    while n < cpus:
        counts.add(n)
        n *= 2
    return tuple(sorted(counts))


def as_loader(obj: Any, loader_kwargs: dict[str, Any] | None = None) -> DataLoader:
    """The DataLoader to tune: ``obj`` itself, or one built from a dataset and keyword arguments."""
    if isinstance(obj, DataLoader):
        if loader_kwargs:
            raise ValueError("DataLoader keyword arguments go with a dataset, not with a DataLoader")
        return obj
    if isinstance(obj, torch.utils.data.Dataset) or hasattr(obj, "__getitem__") and hasattr(obj, "__len__"):
        try:
            return DataLoader(obj, **(loader_kwargs or {}))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"DataLoader refused the arguments: {exc}") from None
    raise ValueError(f"expected a DataLoader or a dataset, got a {type(obj).__name__}")


def current_settings(loader: DataLoader) -> LoaderSettings:
    workers = loader.num_workers
    return LoaderSettings(num_workers=workers, pin_memory=bool(loader.pin_memory),
                          persistent_workers=bool(loader.persistent_workers) and workers > 0,
                          prefetch_factor=(loader.prefetch_factor or 2) if workers > 0 else None)


def objects_to_restore(step: Callable[[Any], Any] | None) -> list[Any]:
    """What timing the step can change, put back afterwards: the modules, optimizers and schedulers
    reached from its closure and the globals it names (none without a step).  The magic and the
    API both choose this way."""
    return objects_used_by(referenced_values(step)) if step is not None else []


@guards
def run_loadertune(loader: DataLoader, options: LoaderTuneOptions = LoaderTuneOptions(), *,
                   step: Callable[[Any], Any] | None = None, state: list[Any] | None = None,
                   device: Device | None = None, label: str = "loader",
                   on_progress: Callable[[str], None] | None = None) -> Outcome[LoaderTuneResult]:
    """Measure ``loader``'s parts under other worker settings and recommend the fastest.

    With ``step``, also time ``step(batch)`` alone and together with the current and the best
    loader, to tell whether the loader or the model limits training; the modules and
    optimizers in ``state`` are restored afterwards.  A Ctrl-C ends it with what was measured (the
    outcome's result) and the interrupt as its error.
    """
    __tracebackhide__ = True  # noqa: F841
    device = device or choose_device()
    progress = on_progress or (lambda text: None)
    started = time.perf_counter()
    tuner = _Tuner(loader, options, device, progress)
    shared_before = shared_memory_fds()
    interrupted = None
    try:
        tuner.sweep()
        if step is not None:
            tuner.with_step(step, state or [])
    except KeyboardInterrupt as exc:
        interrupted = exc
    finally:
        tuner.give_back()
    if interrupted is not None:  # what was measured goes with it
        free_cut_off_batch(interrupted, shared_before)
        return Outcome(tuner.interrupted_result(label, time.perf_counter() - started), error=interrupted)
    return Outcome(tuner.result(label, time.perf_counter() - started))


class _Tuner:
    def __init__(self, loader: DataLoader, options: LoaderTuneOptions, device: Device, progress):
        self.loader, self.options, self.device, self.progress = loader, options, device, progress
        self.current = current_settings(loader)
        self.iterable = isinstance(loader.dataset, IterableDataset)
        self.start_method = _start_method(loader)
        self.pickle_problem = _pickle_problem(loader)
        self.rows: dict[LoaderSettings, LoaderRow] = {}
        self.notes: list[str] = [note for note in (device.choice_note(),) if note]
        # every new iterator draws a seed (and a shuffle) from torch's generator, or the loader's own
        self._generators = Generators(device)
        self._generator = loader.generator.get_state() if loader.generator is not None else None
        # every iterator made, until give_back(): one an interrupt left in a traceback still has workers
        self._iterators: weakref.WeakSet = weakref.WeakSet()
        self.step_s: float | None = None
        self._latest = None  # the iterator a pass is on
        self.stages: list[list[LoaderSettings]] = []  # the settings each stage ran side by side
        self.samples: dict[tuple[int, LoaderSettings], list[float]] = {}
        self.with_step_rows: dict[str, float] = {}
        try:
            self.epoch_batches: int | None = len(loader)
        except TypeError:  # an IterableDataset without __len__
            self.epoch_batches = None

    # --- the sweep --------------------------------------------------------------------

    def sweep(self) -> None:
        pin = self.current.pin_memory or self.device.pinned_memory_helps
        workers = self.options.workers or default_workers()
        counts = [self.current] + [s for s in (_settings(w, pin) for w in workers) if s != self.current]
        self._rounds(counts, "workers")
        # the fastest worker count
        best = fastest_measured(self.current, {s: self.rows[s] for s in counts}, self.stages, self.samples)
        if best.num_workers > 0:  # then the two knobs that only exist with workers
            more = [replace(best, persistent_workers=False),
                    replace(best, prefetch_factor=2 * (best.prefetch_factor or 2))]
            # the current settings run again, so every candidate is paired with them in its own rounds
            knobs = list(dict.fromkeys([self.current, best, *more]))  # best may be the current settings
            self._rounds(knobs, "persistent workers and a deeper prefetch")
        if self.options.rounds < MIN_PAIRED_ROUNDS:
            self.notes.append(f"{self.options.rounds} rounds give no confidence interval (it takes "
                              f"{MIN_PAIRED_ROUNDS}), so no change is recommended: the figures are a first look")
        if self.pickle_problem and self.start_method == "fork":
            self.notes.append(
                f"workers work here because Linux forks them, but the dataset cannot be pickled "
                f"({self.pickle_problem}): on macOS and Windows, where workers are spawned, they would fail")
        if self.iterable:
            self.notes.append("an IterableDataset runs one copy of its iterator per worker: unless it splits its "
                              "data with torch.utils.data.get_worker_info(), N workers yield every item N times "
                              "(and the batches/s above count duplicates)")

    def _rounds(self, settings: list[LoaderSettings], stage: str) -> None:
        for s in settings:
            self.rows.setdefault(s, LoaderRow(settings=s))
        self.stages.append(settings)
        for r in range(self.options.rounds):
            for i in range(len(settings)):
                s = settings[(i + r) % len(settings)]  # rotate the order every round
                row = self.rows[s]
                if row.error is None:
                    self.progress(f"{stage}: round {r + 1} of {self.options.rounds}, {s.label()}…")
                    measured = len(row.batches_per_s)
                    self._pass(s, row)
                    if len(row.batches_per_s) > measured:
                        self.samples.setdefault((len(self.stages) - 1, s), []).append(row.batches_per_s[-1])

    def _pass(self, s: LoaderSettings, row: LoaderRow) -> None:
        if s.num_workers > 0 and self.pickle_problem and self.start_method != "fork":
            row.error = _spawn_message(self.pickle_problem, self.start_method)
            return
        iterator = None
        try:
            loader = self._loader(s)
            start = time.perf_counter()
            iterator = self._iter(loader)
            next(iterator)
            row.first_batch_s.append(time.perf_counter() - start)
            done, timed = self._steady(loader, iterator, s)
            if done:
                row.batches_per_s.append(done / timed)
        except Exception as exc:  # a worker crashed or the dataset raised
            row.error = _loader_failure_text(exc)
        finally:
            # Persistent workers too: left running, they would go on filling their prefetch buffer
            # while the next setting is timed, and slow it.  A pass sees their gain at each new epoch.
            _shutdown(iterator)

    def _steady(self, loader: DataLoader, iterator, s: LoaderSettings) -> tuple[int, float]:
        """Batches and seconds after the start of a pass.  Workers fill a buffer of prefetch_factor
        batches each while the first one is awaited: those are taken untimed, or a short pass would
        time the buffer, not the workers.  A pass runs on into new epochs, and those starts are
        timed: a training loop pays them too (less with persistent workers)."""
        buffered = s.num_workers * (s.prefetch_factor or 0)
        for _ in range(buffered):
            if next(iterator, _END) is _END:
                break
        first, self._latest = iterator, iterator
        done, start, empty = 0, time.perf_counter(), 0
        try:
            while not self._pass_done(done, time.perf_counter() - start, buffered):
                if next(iterator, _END) is not _END:
                    done, empty = done + 1, 0
                    continue
                empty += 1
                if empty >= 2:  # a new epoch gave nothing: the dataset is empty from here
                    break
                if not s.persistent_workers:
                    _shutdown(iterator)
                iterator = self._latest = self._iter(loader)
            return done, time.perf_counter() - start
        finally:
            if self._latest is not first and not s.persistent_workers:
                _shutdown(self._latest)

    def _pass_done(self, done: int, elapsed: float, buffered: int = 0) -> bool:
        """A time-bound pass lasts --seconds.  The ``buffered`` batches the workers prefetched at
        its start go untimed, so on an epoch not much longer than that buffer a pass must also
        run on past the next epoch's start (up to EPOCH_CAP times --seconds), where the workers
        refill their queues (or start again) as they do in training: else it would overstate what
        workers give on short epochs."""
        if self.options.batches is not None:
            return done >= self.options.batches
        if done < MIN_BATCHES or elapsed < self.options.seconds:
            return False
        epoch = self.epoch_batches
        short_epoch = epoch is not None and buffered > 0 and epoch < SHORT_EPOCH_BUFFERS * buffered
        return not short_epoch or done >= epoch or elapsed >= EPOCH_CAP * self.options.seconds

    def _loader(self, s: LoaderSettings) -> DataLoader:
        return DataLoader(**self._kwargs(s))  # fresh each pass: every pass starts its workers, as training does

    def _kwargs(self, s: LoaderSettings) -> dict:
        src = self.loader
        kwargs = dict(dataset=src.dataset, collate_fn=src.collate_fn, worker_init_fn=src.worker_init_fn,
                      generator=src.generator, **s.kwargs())
        if s.num_workers:  # DataLoader refuses these without workers
            kwargs.update(multiprocessing_context=src.multiprocessing_context, timeout=src.timeout or WORKER_TIMEOUT_S)
        if self.iterable:
            kwargs.update(batch_size=src.batch_size, drop_last=src.drop_last)
        else:
            kwargs.update(batch_sampler=src.batch_sampler)
        return kwargs

    def recommendation(self) -> tuple[LoaderSettings, float | None, tuple[float, float] | None]:
        return recommend(self.current, self.rows, self.stages, self.samples)

    # --- with the training step -------------------------------------------------------

    def with_step(self, step: Callable[[Any], Any], state: list[Any]) -> None:
        __tracebackhide__ = True  # noqa: F841  (an error in the step or the dataset is the user's: their frames only)
        snapshot = Snapshot(state, self.device)
        try:
            batch = self._first_batch()
            times = []
            for _ in range(5):
                start = time.perf_counter()
                step(batch)
                self.device.synchronize()
                times.append(time.perf_counter() - start)
            self.step_s = summarize(times[1:]).median
            for name, s in (("current", self.current), ("best", self.recommendation()[0])):
                self.progress(f"with the step: {name} loader…")
                self.with_step_rows[name] = self._steps_per_s(s, step)
        finally:
            snapshot.restore()

    def _first_batch(self):
        """One batch in this process.  The dataset's error is shown from its own frame: the
        DataLoader's frames above it are ours to have called, not the user's to read."""
        __tracebackhide__ = True  # noqa: F841
        try:
            return next(iter(DataLoader(**self._kwargs(LoaderSettings(0)))))
        except Exception as exc:  # noqa: BLE001  (re-raised as it is, with a shorter traceback)
            error = exc
        try:
            raise error.with_traceback(_from_user_code(error.__traceback__))
        finally:
            del error

    def _steps_per_s(self, s: LoaderSettings, step) -> float:
        __tracebackhide__ = True  # noqa: F841
        iterator = None
        try:
            iterator = self._iter(self._loader(s))
            step(next(iterator))
            done, start = 0, time.perf_counter()
            while not self._pass_done(done, time.perf_counter() - start):
                try:
                    step(next(iterator))
                except StopIteration:
                    break
                done += 1
            self.device.synchronize()
            return done / (time.perf_counter() - start)
        finally:
            _shutdown(iterator)

    # --- the end ----------------------------------------------------------------------

    @uninterruptible
    def _iter(self, loader: DataLoader):
        """A new iterator (its workers started), known to give_back() before anyone can lose it."""
        iterator = iter(loader)
        self._iterators.add(iterator)
        deliver_pending()
        return iterator

    @uninterruptible
    def give_back(self) -> None:
        """Stop every worker still running and put back the random state the iterators drew from."""
        for iterator in list(self._iterators):
            _shutdown(iterator)
        multiprocessing.active_children()  # reaps the workers that have exited
        self._generators.restore()
        if self._generator is not None:
            self.loader.generator.set_state(self._generator)
        deliver_pending()

    def interrupted_result(self, label: str, seconds: float) -> LoaderTuneResult:
        """The settings measured before an interrupt, recommending none: a partial sweep's
        rounds are not paired and the settings not yet run could be the fastest."""
        measured = sum(1 for row in self.rows.values() if row.batches_per_s)
        self.notes.append(f"interrupted after {measured} of {len(self.rows)} settings had a pass: "
                          "no change is recommended from a partial sweep")
        return self.result(label, seconds, recommend=False)

    def result(self, label: str, seconds: float, recommend: bool = True) -> LoaderTuneResult:
        best, speedup, ci = self.recommendation() if recommend else (self.current, None, None)
        if recommend:  # a partial sweep's figures stand alone
            vs_current(self.current, self.rows, self.stages, self.samples)
        result = LoaderTuneResult(
            label=label, device=self.device.describe(), current=self.current, best=best,
            fastest=fastest_measured(self.current, self.rows, self.stages, self.samples),
            rows=list(self.rows.values()), speedup=speedup, ci=ci, seconds=seconds, cpus=os.cpu_count() or 1,
            start_method=self.start_method, loader_call=_loader_call(self.loader, best), step_s=self.step_s,
            with_step=dict(self.with_step_rows), notes=self.notes,
            options={"workers": list(self.options.workers or default_workers()), "batches": self.options.batches,
                     "seconds": self.options.seconds, "rounds": self.options.rounds,
                     "expect": self.options.expect.text() if self.options.expect else None})
        if self.options.expect is not None and result.change is not None:
            result.expectation_check = result.change.measured(self.options.expect)
        return result


def _paired(samples: dict, stages: list[list[LoaderSettings]], top: LoaderSettings, base: LoaderSettings):
    """Speedup of ``top`` over ``base`` (the median of their per-round batches/s ratios) and its
    95% CI, over the rounds that ran them side by side, in every stage that ran both.  The interval
    needs MIN_PAIRED_ROUNDS paired rounds in each of those stages: fewer --rounds give none."""
    a: list[float] = []
    b: list[float] = []
    enough = True
    for stage, settings in enumerate(stages):
        if top in settings and base in settings:
            x, y = samples.get((stage, top), []), samples.get((stage, base), [])
            n = min(len(x), len(y))
            a += x[:n]
            b += y[:n]
            enough = enough and n >= MIN_PAIRED_ROUNDS
    if len(a) < 2:
        return None, None
    ratio = paired_ratio(a, b)
    return ratio.estimate, (ratio.ci if enough else None)


def vs_current(current: LoaderSettings, rows: dict[LoaderSettings, LoaderRow],
               stages: list[list[LoaderSettings]], samples: dict) -> None:
    """Each row's speedup over the current settings and its 95% CI, as the table shows them."""
    for s, row in rows.items():
        if s != current and row.error is None:
            row.speedup, row.ci = _paired(samples, stages, s, current)


def fastest_measured(current: LoaderSettings, rows: dict[LoaderSettings, LoaderRow],
                     stages: list[list[LoaderSettings]], samples: dict) -> LoaderSettings:
    """The settings with the highest speedup over the current ones (the table's "× current"), or the
    current settings when none measured faster.  Not by median batches/s: the current settings run in
    every stage and the others in one, so a load that changed between stages could make a slower
    setting's median the highest.  With the current settings failing, the highest median."""
    measured = [s for s, row in rows.items() if row.error is None and row.batches_per_s]
    now = rows.get(current)
    if now is None or now.error is not None or not now.batches_per_s:
        return max(measured, key=lambda s: rows[s].median_batches_per_s) if measured else current
    speedups = {s: _paired(samples, stages, s, current)[0] for s in measured if s != current}
    faster = {s: x for s, x in speedups.items() if x is not None and x > 1}
    return max(faster, key=faster.get) if faster else current


def recommend(current: LoaderSettings, rows: dict[LoaderSettings, LoaderRow],
              stages: list[list[LoaderSettings]], samples: dict
              ) -> tuple[LoaderSettings, float | None, tuple[float, float] | None]:
    """The settings to use, always ones that were measured, with their speedup over the current
    settings and its CI.  Among the settings faster than the current ones with 95% confidence:
    the one with the highest speedup over them, or a simpler one it is not faster than with 95%
    confidence.  None surely faster: the current settings, with the figures of the table's fastest
    (none when that is the current settings).  The view words its headline from these rules."""
    fastest = fastest_measured(current, rows, stages, samples)
    if rows[current].error is not None:  # what works beats what fails
        return fastest, None, None
    faster = {}
    for s, row in rows.items():
        if s != current and row.error is None and row.batches_per_s:
            speedup, ci = _paired(samples, stages, s, current)
            if ci is not None and ci[0] > 1:
                faster[s] = (speedup, ci)
    if not faster:
        return (current, None, None) if fastest == current else (current, *_paired(samples, stages, fastest, current))
    top = max(faster, key=lambda s: faster[s][0])  # as fastest_measured ranks them
    for s in sorted(faster, key=_complexity):
        if _complexity(s) >= _complexity(top):
            break
        _, top_over_s = _paired(samples, stages, top, s)
        if top_over_s is not None and top_over_s[0] <= 1:
            return (s, *faster[s])
    return (top, *faster[top])


def _complexity(s: LoaderSettings) -> int:
    """How many arguments differ from DataLoader's defaults: fewer is simpler to keep."""
    return sum(v is not None and DATALOADER_DEFAULTS.get(k) != v for k, v in s.kwargs().items())


def _settings(workers: int, pin: bool) -> LoaderSettings:
    """Worker counts are compared with persistent workers: a training loop over several epochs
    should keep them (the second stage measures what dropping that costs)."""
    return LoaderSettings(workers, pin, workers > 0, 2 if workers > 0 else None)


@uninterruptible
def _shutdown(iterator) -> None:
    """Stop an iterator's worker processes now, not whenever it is garbage-collected.

    torch closes the iterator's queues without waiting for their feeder threads, and terminates a
    worker that is slow to exit without waiting for it to go: on a loaded machine both outlive the
    call by a while.  Both are waited for here, so no thread or process does."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
        queues = [*getattr(iterator, "_index_queues", ()), getattr(iterator, "_worker_result_queue", None)]
        for feeder in (getattr(q, "_thread", None) for q in queues):
            if feeder is not None and feeder is not threading.current_thread():
                feeder.join(EXIT_WAIT_S)
        for worker in [w for w in getattr(iterator, "_workers", ()) if not getattr(w, "_closed", False)]:
            worker.join(EXIT_WAIT_S)
            if worker.is_alive():  # deaf to SIGTERM
                worker.kill()
                worker.join()
            worker.close()  # its sentinel pipe, now, not when the iterator is collected
        # A queue's pipe closes only when the queue is collected, and an interrupted or failed pass leaves
        # the iterator in a traceback IPython keeps: close the ends now (their feeder threads are done).
        for queue, feeder in ((q, getattr(q, "_thread", None)) for q in queues if q is not None):
            if feeder is None or not feeder.is_alive():
                for end in (getattr(queue, "_reader", None), getattr(queue, "_writer", None)):
                    if end is not None and not end.closed:
                        end.close()
    deliver_pending()


def _from_user_code(tb):
    """The traceback from the first frame that is neither torchmagic's nor torch.utils.data's on (the
    user's dataset or collate function), or all of it where the error arose in those."""
    ours = (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
            os.path.dirname(os.path.abspath(torch.utils.data.__file__)) + os.sep)
    start = tb
    while start is not None and os.path.abspath(start.tb_frame.f_code.co_filename).startswith(ours):
        start = start.tb_next
    return start if start is not None else tb


def _start_method(loader: DataLoader) -> str:
    context = loader.multiprocessing_context
    if context is not None:
        return context.get_start_method() if hasattr(context, "get_start_method") else str(context)
    return torch.multiprocessing.get_start_method(allow_none=False)


class _NoData(pickle.Pickler):
    """Pickles the structure, not the data: tensors and arrays are stood in for, so the check
    is cheap even for a dataset holding gigabytes."""

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor) or type(obj).__name__ == "ndarray":
            return id(obj)
        return None


def _pickle_problem(loader: DataLoader) -> str | None:
    """Why the dataset (or collate or worker-init function) cannot be sent to a spawned worker."""
    for what, obj in (("dataset", loader.dataset), ("collate_fn", loader.collate_fn),
                      ("worker_init_fn", loader.worker_init_fn)):
        if obj is None:
            continue
        try:
            _NoData(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        except Exception as exc:  # PicklingError, AttributeError ("Can't pickle local object"), TypeError
            return f"{what}: {describe_error(exc)}"
    return None


def _spawn_message(problem: str, method: str) -> str:
    return (f"workers are started with {method!r}, which sends the dataset to each worker by pickling, and it cannot "
            f"be pickled ({problem}). Define transforms as module-level functions, not lambdas or local functions; "
            "with spawn (the default on macOS and Windows) keep the dataset class in a .py module the workers can "
            "import, and in a script guard the training code with `if __name__ == \"__main__\":`")


def _loader_failure_text(exc: Exception) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    if "Original Traceback" in str(exc):  # a worker's error: its own last line says what went wrong
        text = f"{text.rstrip('.')}: {lines[-1].strip()}"
    message = f"{type(exc).__name__}: {text[:300]}"
    if "killed by signal" in text or "Bus error" in text:
        message += " — a worker died; in Docker a small /dev/shm is the usual cause (--shm-size, or --ipc=host)"
    elif "timed out" in text:
        message += f" — no batch came from the workers for {WORKER_TIMEOUT_S} s"
    return message


def _loader_call(loader: DataLoader, best: LoaderSettings) -> str:
    """A DataLoader(...) line to copy: the user's own arguments as far as the loader shows them,
    with the recommended worker settings."""
    args = ["dataset"]
    sampler = getattr(loader, "sampler", None)
    if isinstance(loader.dataset, IterableDataset) or loader.batch_size is not None:
        args.append(f"batch_size={loader.batch_size}")
        if isinstance(sampler, torch.utils.data.RandomSampler):
            args.append("shuffle=True")
        elif sampler is not None and not isinstance(sampler, torch.utils.data.SequentialSampler) \
                and not type(sampler).__name__.startswith("_"):
            args.append("sampler=sampler")
        if loader.drop_last:
            args.append("drop_last=True")
    else:
        args.append("batch_sampler=batch_sampler")
    if loader.collate_fn is not None and getattr(loader.collate_fn, "__name__", "") not in ("default_collate", ""):
        args.append(f"collate_fn={loader.collate_fn.__name__}")
    args += [f"{k}={v!r}" for k, v in best.kwargs().items()
             if v is not None and (k == "num_workers" or DATALOADER_DEFAULTS.get(k) != v)]
    return f"DataLoader({', '.join(args)})"
