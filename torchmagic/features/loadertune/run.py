"""Tune a DataLoader: time the loader alone under other worker settings, say which feeds fastest.

Each setting gets a fresh DataLoader built from the user's parts (dataset, batch sampler or
batch size, collate function, worker init), so the user's loader is never iterated.  A pass
times the first batch on its own (worker start-up is a real cost, paid every epoch unless the
workers persist) and then the steady state, in batches per second.  Settings are measured in
interleaved rounds, and the speedup over the loader's current settings gets a 95% CI.
Every worker process started is shut down before the function returns.  Which settings to
recommend is recommendation.py's to say; building loaders and stopping workers, dataloader.py's.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from ...core.devices import Device, choose_device
from ...core.interrupts import deliver_pending, guards, uninterruptible
from ...core.measure import summarize
from ...core.outcome import Outcome
from ...core.state import Generators, Snapshot, objects_used_by, referenced_values
from .cut_off import free_cut_off_batch, shared_memory_fds
from .dataloader import (current_settings, fresh_kwargs, from_user_code, loader_call, loader_failure_text,
                         pickle_problem, shut_down, spawn_message, start_method)
from .options import MIN_PAIRED_ROUNDS, LoaderTuneOptions, default_workers
from .recommendation import fastest_measured, recommend, vs_current
from .result import LoaderRow, LoaderSettings, LoaderTuneResult

MIN_BATCHES = 3         # a time-bound pass still times at least this many batches
SHORT_EPOCH_BUFFERS = 20  # an epoch shorter than this many prefetch buffers is short: its refill shows
EPOCH_CAP = 4           # a pass runs on to a short epoch's next start unless that takes this many times --seconds
_END = object()


def objects_to_restore(step: Callable[[Any], Any] | None) -> list[Any]:
    """What timing the step can change, put back afterwards: the modules, optimizers and schedulers
    reached from its closure and the globals it names (none without a step).  The magic and the
    API both choose this way."""
    return objects_used_by(referenced_values(step)) if step is not None else []


@guards
def run_loadertune(loader: DataLoader, options: LoaderTuneOptions = LoaderTuneOptions(), *,
                   state: list[Any] | None = None, device: Device | None = None, label: str = "loader",
                   on_progress: Callable[[str], None] | None = None) -> Outcome[LoaderTuneResult]:
    """Measure ``loader``'s parts under other worker settings and recommend the fastest.

    With ``options.step``, also time ``step(batch)`` alone and together with the current and the
    best loader, to tell whether the loader or the model limits training; the modules and
    optimizers in ``state`` are restored afterwards.  A Ctrl-C ends it with what was measured (the
    outcome's result) and the interrupt as its error.
    """
    __tracebackhide__ = True  # noqa: F841
    device = device or choose_device()
    progress = on_progress or (lambda text: None)
    started = time.perf_counter()
    tuner = _Tuner(loader, options, device, progress)
    shared_before = shared_memory_fds()
    interrupted = failed = None
    try:
        tuner.sweep()
        if options.step is not None:
            tuner.with_step(options.step, state or [])
    except KeyboardInterrupt as exc:
        interrupted = exc
    except DatasetFailed as exc:
        failed = exc
    finally:
        tuner.give_back()
    if interrupted is not None:  # what was measured goes with it
        free_cut_off_batch(interrupted, shared_before)
        return Outcome(tuner.interrupted_result(label, time.perf_counter() - started), error=interrupted)
    if failed is not None:  # the user's error, from their own frame, below what was measured before it
        result = tuner.failed_result(label, time.perf_counter() - started, failed)
        error, failed = failed.error, None
        return Outcome(result, error=error.with_traceback(from_user_code(error.__traceback__)))
    return Outcome(tuner.result(label, time.perf_counter() - started))


class DatasetFailed(Exception):
    """The user's dataset, sampler or collate function raised during a pass: their error, not the setting's."""

    def __init__(self, settings: LoaderSettings, error: Exception):
        super().__init__(str(error))
        self.settings, self.error = settings, error


class _Tuner:
    def __init__(self, loader: DataLoader, options: LoaderTuneOptions, device: Device, progress):
        self.loader, self.options, self.device, self.progress = loader, options, device, progress
        self.current = current_settings(loader)
        self.iterable = isinstance(loader.dataset, IterableDataset)
        self.start_method = start_method(loader)
        self.pickle_problem = pickle_problem(loader)
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
            row.error = spawn_message(self.pickle_problem, self.start_method)
            return
        iterator = None
        try:
            loader = self._loader(s)
        except Exception as exc:  # noqa: BLE001  (a setting this DataLoader refuses)
            row.error = loader_failure_text(exc)
            return
        try:
            start = time.perf_counter()
            iterator = self._iter(loader)
            next(iterator)
            row.first_batch_s.append(time.perf_counter() - start)
            done, timed = self._steady(loader, iterator, s)
            if done:
                row.batches_per_s.append(done / timed)
        except Exception as exc:  # a worker crashed, or the user's dataset raised
            # Without workers all a pass runs is the user's dataset, sampler and collate function: their
            # error ends the tune.  Under workers, an error (the dataset's, re-raised by torch, or a worker
            # that died or timed out) is that setting's failure: kept in its row, the others still run.
            if s.num_workers == 0:
                raise DatasetFailed(s, exc) from None
            row.error = loader_failure_text(exc)
        finally:
            # Persistent workers too: left running, they would go on filling their prefetch buffer
            # while the next setting is timed, and slow it.  A pass sees their gain at each new epoch.
            shut_down(iterator)

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
                    shut_down(iterator)
                iterator = self._latest = self._iter(loader)
            return done, time.perf_counter() - start
        finally:
            if self._latest is not first and not s.persistent_workers:
                shut_down(self._latest)

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
        # fresh each pass: every pass starts its workers, as training does
        return DataLoader(**fresh_kwargs(self.loader, s))

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
            return next(iter(DataLoader(**fresh_kwargs(self.loader, LoaderSettings(0)))))
        except Exception as exc:  # noqa: BLE001  (re-raised as it is, with a shorter traceback)
            error = exc
        try:
            raise error.with_traceback(from_user_code(error.__traceback__))
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
            shut_down(iterator)

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
            shut_down(iterator)
        multiprocessing.active_children()  # reaps the workers that have exited
        self._generators.restore()
        if self._generator is not None:
            self.loader.generator.set_state(self._generator)
        deliver_pending()

    def interrupted_result(self, label: str, seconds: float) -> LoaderTuneResult:
        """The settings measured before an interrupt, recommending none: a partial sweep's
        rounds are not paired and the settings not yet run could be the fastest."""
        return self._partial_result(label, seconds, "interrupted")

    def failed_result(self, label: str, seconds: float, failed: DatasetFailed) -> LoaderTuneResult:
        """The settings measured before the user's dataset raised, recommending none, and why it stopped."""
        error = failed.error
        text = loader_failure_text(error).partition(": ")[2] or type(error).__name__
        return self._partial_result(label, seconds, f"Stopped: your dataset or collate function raised "
                                    f"{type(error).__name__} under {failed.settings.label()} ({text}; the error "
                                    "is below)")

    def _partial_result(self, label: str, seconds: float, why: str) -> LoaderTuneResult:
        measured = sum(1 for row in self.rows.values() if row.batches_per_s)
        stopped = (f"{why} after {measured} of {len(self.rows)} settings had a pass: "
                   "no change is recommended from a partial sweep")
        return replace(self.result(label, seconds, recommend=False), stopped=stopped)

    def result(self, label: str, seconds: float, recommend: bool = True) -> LoaderTuneResult:
        best, speedup, ci = self.recommendation() if recommend else (self.current, None, None)
        if recommend:  # a partial sweep's figures stand alone
            vs_current(self.current, self.rows, self.stages, self.samples)
        result = LoaderTuneResult(
            label=label, device=self.device.describe(), current=self.current, best=best,
            fastest=fastest_measured(self.current, self.rows, self.stages, self.samples),
            rows=list(self.rows.values()), speedup=speedup, ci=ci, seconds=seconds, cpus=os.cpu_count() or 1,
            start_method=self.start_method, loader_call=loader_call(self.loader, best), step_s=self.step_s,
            with_step=dict(self.with_step_rows), notes=self.notes,
            options=self.options.kept())
        if self.options.expect is not None and result.change is not None:
            result.expectation_check = result.change.measured(self.options.expect)
        return result


def _settings(workers: int, pin: bool) -> LoaderSettings:
    """Worker counts are compared with persistent workers: a training loop over several epochs
    should keep them (the second stage measures what dropping that costs)."""
    return LoaderSettings(workers, pin, workers > 0, 2 if workers > 0 else None)


