"""Run one piece of code under several execution variants and compare them honestly.

For each variant, from the same starting state (weights, optimizer, RNG): build it (compile,
quantize), time its first run (the one-time cost), keep its output for the numerics check,
warm up, and read its peak memory in one more run.  Then time all variants in interleaved
rounds, and summarise each (summary.py) with its median, IQR and its speedup over eager: the median of the
per-round ratios, with a distribution-free CI.  The cycle collector is paused while a run is timed
or its peak read, as timeit and torch.utils.benchmark do: a full collection in a large process
takes longer than many a step, and whether one lands in a run is chance.  What a run used to fix for
all its rounds is the same in every run: the host allocator settled (``settle_allocator``), 10 ms of
untimed calls before each short block, a per-step context (autocast, inference_mode) entered on each call as a
loop enters it, so each call pays for it and for its casts; and the rounds fall into blocks, each started afresh,
the unit of the speedup's interval (docs/statistics.md).
The model, its optimizers and torch's global settings are put back afterwards.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...core.devices import Device, choose_device, is_out_of_memory
from ...core.devices.profiler import ensure_profiler_free
from ...core.gc_pause import gc_paused
from ...core.interrupts import deliver_pending, guards, uninterruptible
from ...core.limits import describe_error
from ...core.measure import BlockStart, Rounds, balanced_calls, calls_per_block, min_pairs, timed_block, timed_call
from ...core.outcome import Outcome
from ...core.render.format import fmt_bytes, fmt_s
from ...core.settings import TorchSettings
from ...core.state import Snapshot, objects_for_model, objects_used_by, outermost
from . import numerics
from .compile_watch import compile_counts, compiled_calls, is_recompile_limit, loud_recompile_limit
from .interrupted_compile import CompileLeftovers, hide_torch_frames
from .options import AMP_DTYPES, CompareOptions
from .result import CompareResult, VariantResult
from .summary import MeasuredVariant, record_compile, rounds_notes, summarise
from .variants import CudaGraphs, Env, Variant, graph_steps

PROGRESS_INTERVAL_S = 0.25
# The timed rounds fall into this many blocks, each started afresh, and the speedup's interval is made over
# their estimates: the fewest that give a distribution-free 95% interval.  One run's rounds share what the
# run fixes (the allocator's state, what ran before), so an interval over them held the ratio of that run
# only: repeated runs' intervals missed each other.
BLOCKS = min_pairs()
# A variant's block of calls in a round starts with untimed calls lasting at least LEAD_IN_S where its calls are
# shorter than LEAD_IN_MAX_S: the calls after another variant's find the caches holding that variant's weights and
# activations, which no step in a training loop pays.  On BERT (3 ms calls, the AVX512 EPYC) the first call after a
# switch ran 4-30% slow and the next three 2-6%, 0.3-3% and under 2%; with one untimed call that tail was timed, and
# a variant's speedup depended on how many calls its blocks got (compile 1.07x with one, 1.12x with two and in a loop).
LEAD_IN_S = 0.01
LEAD_IN_MAX_S = 0.1
_INDUCTOR = "torch._inductor.compile_fx"  # imported by the first torch.compile() call in a process


@dataclass(frozen=True)
class Workload:
    """What is compared: ``fn(m)``, with each variant's version ``m`` of ``model`` (None: no model, the
    variant's context alone).  ``output`` maps a run's value to what the numerics check compares (default:
    the value itself); ``after_baseline`` is called right after eager's first run, while its effects are
    fresh (the magic keeps the cell's variables from that run)."""

    fn: Callable[[Any], Any]
    model: nn.Module | None = None
    output: Callable[[Any], Any] | None = None
    after_baseline: Callable[[], None] | None = None


def objects_to_restore(model: Any, names: Iterable[Any], scope: dict[str, Any]) -> list[Any]:
    """What the variants can change, put back before each and afterwards: the stateful objects
    reached from the values the code ``names`` (modules, optimizers ...; ``objects_used_by``) and,
    with a model, the model and the optimizers in ``scope`` holding its parameters, with their
    schedulers.  The magic and the API both choose this way."""
    found = objects_for_model(model, [], scope) if model is not None else []
    for value in objects_used_by(names):
        if not any(value is f for f in found):
            found.append(value)
    return outermost(found)


@guards
def run_compare(workload: Workload, options: CompareOptions, *, state: list[Any], device: Device | None = None,
                label: str = "compare", on_progress: Callable[[str], None] | None = None) -> Outcome[CompareResult]:
    """Compare ``workload.fn(model_variant)`` across ``options.variants``.

    ``state`` lists the stateful objects (modules, optimizers, schedulers) to restore before each
    variant and afterwards.
    """
    __tracebackhide__ = True  # noqa: F841  (a failing cell shows the user's frames only)
    ensure_profiler_free()  # peaks are read with a profiler, and profiled timings would mean little
    return _Comparison(workload, options, state, device or choose_device(), on_progress).run(label)


class _Comparison:
    def __init__(self, workload: Workload, options: CompareOptions, state: list[Any], device: Device,
                 on_progress: Callable[[str], None] | None):
        self.fn, self.model, self.options = workload.fn, workload.model, options
        self.env = Env(device, _amp_dtype(options.dtype, device), list(state))
        self.state = state
        self.output = workload.output or (lambda value: value)
        self.progress = on_progress or (lambda text: None)
        self.after_baseline = workload.after_baseline
        self.entries = [MeasuredVariant(v, VariantResult(v.name, precision=v.precision(self.env),
                                                         dtype=v.dtype(self.env), device=device.label))
                        for v in options.variants]
        self.advance_notes = advance_notes(options, device)
        self.snapshot: Snapshot | None = None
        self.reference: numerics.Reference | None = None
        self.recompile_limit: int | None = None  # the user's setting (raised while comparing)
        self.graph_notes: list[str] = []
        self.cleanup_notes: list[str] = []  # partial files an interrupted compile left, removed

    @property
    def device(self) -> Device:
        return self.env.device

    def run(self, label: str) -> Outcome[CompareResult]:
        __tracebackhide__ = True  # noqa: F841
        settings = TorchSettings.capture()
        started = time.perf_counter()
        self.snapshot = Snapshot(self.state, self.device) if self.options.restore else None
        self.device.settle_allocator()  # where a step's blocks come from must not change from run to run
        compiled = sum(v.compiles for v in self.options.variants)
        graphs = CudaGraphs(list(self.options.variants), self.env)
        pools_at_start = self.device.graph_pool_bytes() if graphs.active else None
        run: Outcome[CompareResult] = Outcome(None)  # value: the baseline's first run's (the cell's)
        rounds, measured = None, []
        leftovers = CompileLeftovers() if compiled else None  # what a compile cut short must not leave
        finished = False
        try:
            with loud_recompile_limit(compiled) if compiled else contextlib.nullcontext() as limit:
                self.recompile_limit = limit
                for entry in self.entries:
                    self._prepare(entry, run)
                measured = [e for e in self.entries if e.out.ok]
                for entry, calls in zip(measured, balanced_calls([e.call_s for e in measured])):
                    entry.calls = calls
                rounds = Rounds([self._block(e) for e in measured], rounds=self.options.runs,
                                min_time=self.options.min_time, min_rounds=self.options.min_rounds, blocks=BLOCKS,
                                block_start=BlockStart([self._warm_up(e) for e in measured],
                                                       refresh=self.device.empty_cache))
                self._timed_rounds(rounds, measured)
            finished = True
        except BaseException as exc:  # noqa: BLE001  eager's own error or an interrupt: the caller re-raises it
            run.error = exc
        finally:
            self._put_back(settings, graphs, pools_at_start, None if finished else leftovers)
        if isinstance(run.error, KeyboardInterrupt):
            hide_torch_frames(run.error)  # e.g. in a compile: the user's frames, not 700 lines of dynamo and inductor
            for note in self.cleanup_notes:
                run.error.add_note(note)
        if rounds is None:  # eager failed on its first run (the user's code is broken), or an interrupt came first
            return run
        summarise(measured, rounds)
        run.result = CompareResult(label=label, device=self.device.describe(), variants=[e.out for e in self.entries],
                                   rounds=rounds.done, blocks=len(rounds.block_lengths(rounds.done)),
                                   seconds=time.perf_counter() - started,
                                   amp_dtype=str(self.env.amp_dtype).removeprefix("torch."),
                                   options=self.options.kept(),
                                   expectation_check=self.entries[-1].out.measured(self.options.expect)
                                   if self.options.expect else None,
                                   notes=self._notes(run, rounds) + self.graph_notes)
        return run

    def _notes(self, run: Outcome, rounds: Rounds) -> list[str]:
        notes = [note for note in (self.device.choice_note(),) if note] + self.advance_notes
        notes += [] if self.options.restore else [
            "--no-restore: the model and optimizer keep what the runs did to them, and variants started from "
            "different weights (the errors are only meaningful for code that does not train)"]
        return notes + rounds_notes(run, rounds, len(self.entries))

    def _prepare(self, entry: MeasuredVariant, run: Outcome) -> None:
        """From the starting state: build, first run (one-time cost, numerics), warm-up, peak."""
        __tracebackhide__ = True  # noqa: F841
        variant, out, env = entry.variant, entry.out, self.env
        problem = variant.problem(self.model, env)
        if problem:
            entry.fail(problem)
            return
        out.notes += variant.caveats(env)
        self.progress(f"{variant.name}: {'compiling (first run)' if variant.compiles else 'first run'}…")
        if self.snapshot is not None:
            self.snapshot.restore()
        pools_before = self.device.graph_pool_bytes() if variant.uses_cuda_graphs(env) else None
        try:
            inductor_loaded = _INDUCTOR in sys.modules  # before torch.compile, which imports it
            start = time.perf_counter()
            entry.built = variant.build(self.model, env)
            build_s = time.perf_counter() - start
            before = compile_counts()
            call = self._runner(entry)
            with variant.around_call(entry.built, env):
                value, first_s = timed_call(call, self.device)
            first = compile_counts() - before
            self._check_output(entry, value, run)
            del value
            out.first_call_s = build_s + first_s
            self.progress(f"{variant.name}: warm-up…")
            entry.call_s = self._warm_up_runs(entry, call, first_s)
            # a compiled variant whose runs are eager's is never timed under the compile's name
            compiled = not variant.compiles or record_compile(entry, first, compile_counts() - before,
                                                              self._once_in(entry, compiled_calls()), self.model)
            entry.counts = compile_counts() - before - first
            if compiled and variant.compiles and not inductor_loaded and _INDUCTOR in sys.modules:
                out.notes.append(f"the first compile in this process: its one-time cost includes loading "
                                 f"inductor (the torch.compile call alone took {fmt_s(build_s)}), which "
                                 "later compiles in this process skip")
            if compiled:
                out.peak_bytes = self._peak(entry)
                if pools_before is not None:
                    self._record_graph_pool(entry, pools_before, (first + entry.counts).cudagraph_skips)
        except Exception as exc:  # noqa: BLE001
            if variant.is_baseline:
                raise  # the user's code fails on its own: show their traceback
            entry.fail(_failure_text(exc, variant, self.recompile_limit))
            _forget(exc)
        if not entry.out.ok:  # outside the except block: the failed run's tensors can go now
            _release(self.device)

    def _warm_up_runs(self, entry: MeasuredVariant, call: Callable[[], Any], first_s: float) -> float:
        """The untimed runs after the first; the fastest run seen, which sizes the timed blocks."""
        fastest = first_s
        for _ in range(self.options.warmup):
            with entry.variant.around_call(entry.built, self.env):
                _, seconds = timed_call(call, self.device)
            fastest = min(fastest, seconds)
        return fastest

    def _check_output(self, entry: MeasuredVariant, value, run: Outcome) -> None:
        compared = self.output(value)
        if entry.variant.is_baseline:
            run.value = value
            self.reference = numerics.reference(compared)
            if self.after_baseline is not None:
                self.after_baseline()
            return
        _judge_output(entry, compared, self.reference, self.options, self.model)

    def _once_in(self, entry: MeasuredVariant, scope: contextlib.AbstractContextManager) -> Any:
        """What ``scope`` (a profiler reading something) read over one more run of the variant."""
        with scope as reading:
            with entry.variant.around_call(entry.built, self.env):
                self._runner(entry)()
            self.device.synchronize()
        return reading

    def _peak(self, entry: MeasuredVariant) -> int | None:
        # The peak counts from the start of the run: a collection inside it that freed older
        # garbage would lower it by an amount that has nothing to do with the code.
        with gc_paused():
            return self._once_in(entry, self.device.peak_scope()).peak_bytes

    def _block(self, entry: MeasuredVariant) -> Callable[[], tuple[float, int]]:
        call = self._runner(entry)
        lead_in = calls_per_block(entry.call_s, LEAD_IN_S) if entry.call_s < LEAD_IN_MAX_S else 0

        def run_block() -> tuple[float, int]:
            __tracebackhide__ = True  # noqa: F841
            with gc_paused():
                for _ in range(lead_in):
                    call()
                return timed_block(call, entry.calls, self.device), entry.calls

        return _in_variant(entry, self.env, run_block)

    def _warm_up(self, entry: MeasuredVariant) -> Callable[[], None]:
        """One untimed run, after the allocator handed its cache back: what a new run's warm-up does."""
        call = self._runner(entry)

        def warm_up() -> None:
            __tracebackhide__ = True  # noqa: F841
            call()
            self.device.synchronize()

        return _in_variant(entry, self.env, warm_up)

    def _runner(self, entry: MeasuredVariant) -> Callable[[], Any]:
        call = entry.variant.in_step(_bound(self.fn, entry), self.env, lambda: entry.built)
        return graph_steps(call) if entry.variant.uses_cuda_graphs(self.env) else call

    def _record_graph_pool(self, entry: MeasuredVariant, before: int, skips: int) -> None:
        """The CUDA graph pool the variant grew: allocated while its graphs were recorded (its first
        runs) and kept while they live, where its peak, read over one replay, sees nothing."""
        after = self.device.graph_pool_bytes()
        if after is not None:
            entry.out.graph_pool_bytes = max(after - before, 0)
            shared = [e.variant.name for e in self.entries if e is not entry and e.out.graph_pool_bytes is not None]
            entry.out.notes += graph_pool_notes(entry.out.graph_pool_bytes, shared, skips)

    @uninterruptible
    def _put_back(self, settings: TorchSettings, graphs: CudaGraphs, pools_at_start: int | None,
                  leftovers: CompileLeftovers | None) -> None:
        """The model, optimizer, RNG and torch's settings as they were; built variants and CUDA graph
        pools dropped; after a run cut short, what its compiles left half-made.  The first statement
        of the run's ``finally``: a Ctrl-C waits for all of it."""
        for entry in self.entries:
            entry.built = None  # drop compiled wrappers and quantized copies now
        if self.snapshot is not None:
            self.snapshot.restore()
        settings.restore()
        if graphs.active and (note := _release_graphs(self.device, graphs, pools_at_start)):
            self.graph_notes.append(note)
        if leftovers is not None:  # last: the user's state is back whatever this finds
            self.cleanup_notes = leftovers.clean()
        deliver_pending()

    def _timed_rounds(self, rounds: Rounds, measured: list[MeasuredVariant]) -> None:
        __tracebackhide__ = True  # noqa: F841

        def on_error(i: int, exc: Exception) -> None:
            __tracebackhide__ = True  # noqa: F841
            entry = measured[i]
            if entry.variant.is_baseline:
                raise exc
            entry.fail(f"{_failure_text(exc, entry.variant, self.recompile_limit)} (in timed round {rounds.done + 1})")
            _forget(exc)
            _release(self.device)

        target = f"{rounds.rounds}" if rounds.rounds else f"at least {rounds.fewest()}"
        self.progress(f"timing: round 1 of {target}…")
        last = time.monotonic()

        def on_round(done: int) -> None:
            # A progress update is a message the kernel sends while other variants are timed; a
            # comparison can finish 100 rounds a second, so report a few times a second at most.
            nonlocal last
            if time.monotonic() - last >= PROGRESS_INTERVAL_S:
                last = time.monotonic()
                self.progress(f"timing: round {done + 1} of {target}…")

        rounds.run(on_round=on_round, on_error=on_error)



def advance_notes(options: CompareOptions, device: Device) -> list[str]:
    """What to say before anything runs: autocast variants on a device where 16-bit autocast is
    not expected to pay off (the device layer reads it from CPU flags or compute capability)
    are measured all the same, and say so first."""
    names = [v.name for v in options.variants if v.autocasts]
    if not names:
        return []
    try:
        low = device.low_precision()
    except NotImplementedError:  # a device that cannot tell
        return []
    if low.fast:
        return []
    dtype = str(_amp_dtype(options.dtype, device)).removeprefix("torch.")
    note = (f"{', '.join(names)}: {low.reason}, so {dtype} autocast is expected to run {low.expected} float32 here; "
            "measuring anyway")
    return [note]


def _amp_dtype(name: str | None, device: Device) -> torch.dtype:
    if name is not None:
        return AMP_DTYPES[name]
    return device.low_precision().dtype or torch.bfloat16


def _in_variant(entry: MeasuredVariant, env: Env, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` in the variant's context, its recompiles counted."""

    def run() -> Any:
        __tracebackhide__ = True  # noqa: F841
        with entry.variant.around_call(entry.built, env):
            before = compile_counts() if entry.variant.compiles else None
            value = fn()
            if before is not None:
                entry.counts = entry.counts + (compile_counts() - before)
        return value

    return run


def _bound(fn, entry: MeasuredVariant) -> Callable[[], Any]:
    def call():
        __tracebackhide__ = True  # noqa: F841
        return fn(entry.built)  # read at each call: the timed blocks must not keep a dropped variant alive

    return call


def _judge_output(entry: MeasuredVariant, compared: Any, reference: numerics.Reference | None,
                  options: CompareOptions, model: nn.Module | None) -> None:
    """A variant's output against eager's (``reference``): its errors, and whether they are within its
    precision's tolerance."""
    out = entry.out
    if reference is None:
        out.notes.append("no numerics check: the code's output holds no tensors or numbers "
                         "(%%amp_compare --accuracy-of NAME names one; the API compares what fn returns)")
        return
    rtol, atol = numerics.tolerance(out.precision, options.rtol, options.atol)
    error = numerics.compare(compared, reference, rtol, atol)
    out.max_abs_err, out.max_rel_err, out.tolerance = error.max_abs, error.max_rel, (rtol, atol)
    out.numerics_ok = error.ok
    if error.problem:
        out.notes.append(f"output differs from eager's: {error.problem}")
    elif entry.variant.compiles and _active_dropout(model):
        out.numerics_ok = None  # compiled dropout draws other random numbers than eager's
        out.notes.append("error not judged: the model's dropout is active, and compiled code draws different "
                         "random masks than eager (call model.eval() or compare an inference step)")
    elif not error.ok:
        out.notes.append(f"max error {error.max_abs:.3g} is over the tolerance "
                         f"(atol {atol:g} + rtol {rtol:g} × max|eager output|)")


def _active_dropout(model) -> bool:
    return model is not None and any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and m.training
                                     for m in model.modules())


def _failure_text(exc: BaseException, variant: Variant, recompile_limit: int | None) -> str:
    if is_recompile_limit(exc):
        return (f"dynamo hit its recompile limit ({recompile_limit}): what the compiled code was specialised on "
                "keeps changing; outside this comparison dynamo would silently run eager from here")
    if is_out_of_memory(exc):
        return "out of memory"
    message = describe_error(exc)
    inference_only = [t.name for t in variant.techniques if t.name in ("inference_mode", "int8")]
    if inference_only and any(w in str(exc) for w in ("grad", "backward", "Inference")):
        message += f" — {inference_only[0]} is for inference, and this code seems to train"
    return message


def _forget(exc: BaseException) -> None:
    """Drop the frames a failed variant's exception holds (its tensors, on the device too)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__context__ or exc.__cause__


def graph_pool_notes(pool_bytes: int, shared: list[str], skips: int) -> list[str]:
    """What a variant's CUDA graph pool holds, and the graphs inductor left without CUDA graphs."""
    notes = [f"CUDA graph pool: {fmt_bytes(pool_bytes)}, allocated when its graphs were recorded and held while "
             "they live; a replay allocates nothing, so peak mem leaves it out"
             + (f" (one pool per device, shared with {', '.join(shared)}: this is what it added)" if shared else "")]
    if skips:
        notes.append(f"inductor left {skips} of its graphs without CUDA graphs (as it does for CPU tensors, mutated "
                     "inputs, dynamic shapes and more; TORCH_LOGS=cudagraphs says why): those run as ordinary kernel "
                     "launches")
    return notes


def _release_graphs(device: Device, graphs: CudaGraphs, pools_at_start: int | None) -> str | None:
    """Give back the CUDA graph pools a comparison recorded, so later magics see the memory; what stays, said."""
    note = graphs.release()
    gc.collect()  # the dropped code and the functions it recorded; their graph tree goes in the next pass
    _release(device)  # which then hands the pool's memory back
    held = (device.graph_pool_bytes() or 0) - (pools_at_start or 0)
    if note or held <= 0:
        return note
    return (f"CUDA graph pools still hold {fmt_bytes(held)} more than before the comparison: something in this "
            "process keeps them (code compiled elsewhere with CUDA graphs shares the device's graph tree, or "
            "tensors a graph returned are still referenced); torch._dynamo.reset() frees them, and makes "
            "all compiled code compile again on its next call")


def _release(device: Device) -> None:
    gc.collect()
    device.empty_cache()
