"""Run one piece of code under several execution variants and compare them honestly.

For each variant, from the same starting state (weights, optimizer, RNG): build it (compile,
quantize), time its first run (the one-time cost), keep its output for the numerics check,
warm up, and read its peak memory in one more run.  Then time all variants in interleaved
rounds, and summarise each with its median, IQR and a bootstrap CI of its speedup over eager.
The model, its optimizers and torch's global settings are put back afterwards.
"""

from __future__ import annotations

import contextlib
import gc
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..devices import Device, current_device, is_out_of_memory
from ..measure import Rounds, bootstrap_ratio_ci, calls_per_block, summarize, timed_block, timed_call
from ..results.compare import CompareResult, VariantResult
from . import numerics
from .compile_watch import CompileCounts, compile_counts, is_recompile_limit, loud_recompile_limit
from .settings import TorchSettings
from .state import Snapshot
from .variants import Env, Variant

AMP_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


@dataclass(frozen=True)
class CompareOptions:
    variants: tuple[Variant, ...]
    runs: int | None = None        # rounds; None: until min_time
    min_time: float = 1.0          # seconds of timed runs per variant (at least MIN_ROUNDS rounds)
    min_rounds: int = 10
    warmup: int = 3
    dtype: str | None = None       # autocast dtype for amp: bf16 or fp16 (default: the device's choice)
    atol: float | None = None
    rtol: float | None = None
    restore: bool = True

    def __post_init__(self):
        if self.runs is not None and self.runs < 2:
            raise ValueError("--runs needs at least 2 rounds (a confidence interval needs more than one)")
        if not self.min_time > 0:
            raise ValueError("--min-time must be positive")
        if self.warmup < 0:
            raise ValueError("--warmup cannot be negative")
        if self.dtype is not None and self.dtype not in AMP_DTYPES:
            raise ValueError(f"--dtype is bf16 or fp16, got {self.dtype!r}")
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"--{name} must be a non-negative number")
        if not self.variants or not self.variants[0].is_baseline:
            raise ValueError("the first variant must be the eager baseline")


@dataclass
class CompareRun:
    result: CompareResult | None
    value: Any = None                  # what the baseline's first run returned (the cell's value)
    error: BaseException | None = None  # the baseline's own failure, or an interrupt


@dataclass
class _Entry:
    """A variant while it is being measured: its built model and what was seen so far."""

    variant: Variant
    out: VariantResult
    built: Any = None
    calls: int = 1
    counts: CompileCounts = field(default_factory=CompileCounts)

    def fail(self, message: str) -> None:
        self.out.ok = False
        self.out.error = message
        self.built = None


def run_compare(fn: Callable[[Any], Any], model: nn.Module | None, options: CompareOptions, *,
                state: list[Any], device: Device | None = None, label: str = "compare",
                output: Callable[[Any], Any] | None = None,
                on_progress: Callable[[str], None] | None = None,
                after_baseline: Callable[[], None] | None = None) -> CompareRun:
    """Compare ``fn(model_variant)`` across ``options.variants``.

    ``output`` maps a run's return value to what the numerics check compares (default: the
    value itself).  ``after_baseline`` is called right after eager's first run, while its
    effects are fresh (the magic keeps the cell's variables from that run).
    """
    __tracebackhide__ = True  # noqa: F841  (a failing cell shows the user's frames only)
    device = device or current_device()
    progress = on_progress or (lambda text: None)
    output = output or (lambda value: value)
    env = Env(device, _amp_dtype(options.dtype, device), list(state))
    settings = TorchSettings.capture()
    started = time.perf_counter()
    snapshot = Snapshot(state, device) if options.restore else None
    entries = [_Entry(v, VariantResult(v.name, precision=v.precision(env))) for v in options.variants]
    compiled = sum(v.compiles for v in options.variants)
    rounds, measured = None, []
    run = CompareRun(None)
    try:
        with loud_recompile_limit(compiled) if compiled else contextlib.nullcontext():
            _first_runs(fn, model, entries, env, options, snapshot, output, progress, after_baseline, run)
            measured = [e for e in entries if e.out.ok]
            rounds = Rounds([_block(fn, e, env) for e in measured], rounds=options.runs,
                            min_time=options.min_time, min_rounds=options.min_rounds)
            _timed_rounds(rounds, measured, env, progress)
    except BaseException as exc:  # noqa: BLE001  the baseline's own error or an interrupt: re-raised by the caller
        run.error = exc
    finally:
        for entry in entries:
            entry.built = None  # drop compiled wrappers and quantized copies now
        if snapshot is not None:
            snapshot.restore()
        settings.restore()
    if rounds is None:  # eager failed on its first run (the user's code is broken), or an interrupt came first
        return run
    _summarise(measured, rounds)
    notes = [] if options.restore else [
        "--no-restore: the model and optimizer keep what the runs did to them, and variants started from "
        "different weights (the errors are only meaningful for code that does not train)"]
    if isinstance(run.error, KeyboardInterrupt):
        notes.append(f"interrupted after {rounds.done} rounds: the figures cover what ran")
    elif run.error is not None:
        notes.append(f"eager failed in timed round {rounds.done + 1}: the figures cover the rounds before")
    run.result = CompareResult(label=label, device=device.describe(), variants=[e.out for e in entries],
                               rounds=rounds.done, seconds=time.perf_counter() - started,
                               amp_dtype=str(env.amp_dtype).removeprefix("torch."),
                               options=_options_dict(options), notes=notes)
    return run


def _amp_dtype(name: str | None, device: Device) -> torch.dtype:
    if name is not None:
        return AMP_DTYPES[name]
    return device.low_precision().dtype or torch.bfloat16


def _first_runs(fn, model, entries, env, options, snapshot, output, progress, after_baseline, run) -> None:
    """Per variant, from the starting state: build, first run, numerics, warm-up, peak."""
    __tracebackhide__ = True  # noqa: F841
    reference = None
    for entry in entries:
        variant, out = entry.variant, entry.out
        problem = variant.problem(model, env)
        if problem:
            entry.fail(problem)
            continue
        out.notes += variant.caveats(env)
        progress(f"{variant.name}: {'compiling (first run)' if variant.compiles else 'first run'}…")
        if snapshot is not None:
            snapshot.restore()
        try:
            start = time.perf_counter()
            entry.built = variant.build(model, env)
            build_s = time.perf_counter() - start
            before = compile_counts()
            inductor_loaded = "torch._inductor.compile_fx" in sys.modules
            call = _bound(fn, entry.built)
            with variant.around_call(entry.built, env):
                value, first_s = timed_call(call, env.device)
            first = compile_counts() - before
            compared = output(value)
            if variant.is_baseline:
                run.value = value
                reference = numerics.reference(compared)
                if after_baseline is not None:
                    after_baseline()
            else:
                _check_numerics(entry, compared, reference, model, options)
            del value, compared
            out.first_call_s = build_s + first_s
            if variant.compiles:
                _record_compile(entry, first)
                if not inductor_loaded and "torch._inductor.compile_fx" in sys.modules:
                    out.notes.append("the first compile in this process: its cost includes loading inductor")
            estimate = first_s
            progress(f"{variant.name}: warm-up…")
            for _ in range(options.warmup):
                with variant.around_call(entry.built, env):
                    _, seconds = timed_call(call, env.device)
                estimate = min(estimate, seconds) if estimate is not None else seconds
            entry.calls = calls_per_block(estimate)
            entry.counts = compile_counts() - before - first
            out.peak_bytes = _peak(fn, entry, env)
        except Exception as exc:  # noqa: BLE001
            if variant.is_baseline:
                raise  # the user's code fails on its own: show their traceback
            entry.fail(_describe(exc, variant))
            del exc
            _release(env.device)


def _bound(fn, model) -> Callable[[], Any]:
    def call():
        __tracebackhide__ = True  # noqa: F841
        return fn(model)

    return call


def _check_numerics(entry: _Entry, compared, reference, model, options) -> None:
    out = entry.out
    if reference is None:
        out.notes.append("no numerics check: the code's output holds no tensors or numbers "
                         "(name one with --output NAME)")
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


def _record_compile(entry: _Entry, first: CompileCounts) -> None:
    out = entry.out
    out.graphs, out.graph_breaks = first.graphs, first.graph_breaks
    if first.frames == 0:
        out.compile_cache = "in memory"
        out.notes.append("reused code compiled earlier in this kernel: the one-time cost shown is not a "
                         "fresh compile (a new process pays it again)")
    elif first.graphs == 0:
        out.fell_back = True
        out.notes.append("ran eager: dynamo produced no graph for this code")
    else:
        out.compile_cache = "warm disk cache" if first.cache_hits and not first.cache_misses else "cold"
        if out.compile_cache != "cold":
            out.notes.append("inductor's on-disk cache held these graphs: a cold compile takes longer")
    if first.graph_breaks:
        reasons = "; ".join(first.break_reasons[:2]) or "see torch._dynamo.explain"
        out.notes.append(f"{first.graph_breaks} graph break{'s' if first.graph_breaks != 1 else ''} "
                         f"({reasons}): code between graphs runs eager")


def _peak(fn, entry: _Entry, env: Env) -> int | None:
    try:
        with env.device.peak_scope() as reading:
            with entry.variant.around_call(entry.built, env):
                _bound(fn, entry.built)()
            env.device.synchronize()
    except RuntimeError as exc:  # a profiler already running (inside %%torchprofile) cannot nest
        if "profiler" not in str(exc).lower():
            raise
        entry.out.notes.append("peak memory not measured: another profiler is running")
        return None
    return reading.peak_bytes


def _block(fn, entry: _Entry, env: Env) -> Callable[[], tuple[float, int]]:
    call = _bound(fn, entry.built)

    def run_block() -> tuple[float, int]:
        __tracebackhide__ = True  # noqa: F841
        with entry.variant.around_call(entry.built, env):
            before = compile_counts() if entry.variant.compiles else None
            seconds = timed_block(call, entry.calls, env.device)
            if before is not None:
                entry.counts = entry.counts + (compile_counts() - before)
        return seconds, entry.calls

    return run_block


def _timed_rounds(rounds: Rounds, measured: list[_Entry], env: Env, progress) -> None:
    __tracebackhide__ = True  # noqa: F841

    def on_error(i: int, exc: Exception) -> None:
        __tracebackhide__ = True  # noqa: F841
        entry = measured[i]
        if entry.variant.is_baseline:
            raise exc
        entry.fail(f"{_describe(exc, entry.variant)} (in timed round {rounds.done + 1})")
        _release(env.device)

    target = f"{rounds.rounds}" if rounds.rounds else f"at least {rounds.min_rounds}"
    progress(f"timing: round 1 of {target}…")
    rounds.run(on_round=lambda done: progress(f"timing: round {done + 1} of {target}…"), on_error=on_error)


def _summarise(measured: list[_Entry], rounds: Rounds) -> None:
    """Medians, speedups with paired-bootstrap CIs, one-time costs and break-even, per variant."""
    if not measured:
        return
    base = rounds.samples[0]
    for entry, samples in zip(measured, rounds.samples):
        out = entry.out
        out.samples_s, out.calls_per_sample = list(samples), entry.calls
        summary = summarize(samples)
        if summary is None or not out.ok:  # failed mid-way: its partial times are not compared
            continue
        out.median_s, out.iqr_s = summary.median, summary.iqr
        if entry.variant.is_baseline:
            out.speedup = 1.0
            continue
        n = min(len(base), len(samples))  # rounds both completed, paired by index
        if n == 0:
            continue
        base_median, median = summarize(base[:n]).median, summarize(samples[:n]).median
        out.speedup = base_median / median
        out.ci = bootstrap_ratio_ci(base[:n], samples[:n]) if n >= 2 else None
        if entry.variant.compiles or any(t.build for t in entry.variant.techniques):
            out.compile_s = max(out.first_call_s - out.median_s, 0.0)
            if out.ci is not None and out.ci[0] > 1:
                out.break_even_runs = max(1, math.ceil(out.compile_s / (base_median - median)))
        if entry.variant.compiles:
            out.recompiles = entry.counts.frames
            if entry.counts.frames:
                out.notes.append(f"recompiled {entry.counts.frames}× after its first run: what the compiled code was "
                                 "specialised on (shapes, Python values) keeps changing; each recompile costs a "
                                 "compile, and past torch._dynamo.config.recompile_limit dynamo runs eager")


def _describe(exc: BaseException, variant: Variant) -> str:
    if is_recompile_limit(exc):
        import torch._dynamo

        limit = torch._dynamo.config.recompile_limit
        return (f"dynamo hit its recompile limit ({limit}): the code keeps changing what compiled code was "
                "specialised on; outside this comparison dynamo would silently run eager from here")
    if is_out_of_memory(exc):
        return "out of memory"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    message = f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__
    inference_only = [t.name for t in variant.techniques if t.name in ("inference_mode", "int8")]
    if inference_only and any(w in str(exc) for w in ("grad", "backward", "Inference")):
        message += f" — {inference_only[0]} is for inference, and this code seems to train"
    return message


def _release(device: Device) -> None:
    gc.collect()
    device.empty_cache()


def _options_dict(options: CompareOptions) -> dict:
    return {"variants": [v.name for v in options.variants], "runs": options.runs, "min_time": options.min_time,
            "min_rounds": options.min_rounds, "warmup": options.warmup, "dtype": options.dtype,
            "atol": options.atol, "rtol": options.rtol, "restore": options.restore}
