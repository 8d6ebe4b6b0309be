"""The Python API: each magic's engine as a plain function, returning the same result objects."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from .core.cell import Cell
from .core.devices import Device, choose_device
from .core.expectations import Expectation, as_expectation
from .core.shell import current_shell
from .core.limits import SettingError, parse_budget_text, usable_cores
from .core.render.saved import NotAResultFile
from .core.outcome import Outcome
from .core.state import names_used, objects_used_by, referenced_values, values_named
from .features.autobatch.result import AutobatchResult
from .features.autobatch.options import AutobatchOptions
from .features.autobatch.run import run_autobatch
from .features.autobatch.run import objects_to_restore as restored_by_autobatch
from .features.compare.result import CompareResult
from .features.compare.options import CompareOptions
from .features.compare.repeated import compared_again
from .features.compare.run import Workload, run_compare
from .features.compare.run import objects_to_restore as restored_by_compare
from .features.compare.variants import DEFAULT_VARIANTS, Variant, parse_variants
from .features.memory.result import MemoryResult
from .features.profile.result import ProfileResult
from .features.profile.options import ProfileOptions
from .features.profile.run import run_profile
from .features.profile.traces.reader import TraceFileError
from .features.profile.user import UserSetup, user_setup
from .features.profile.verify import Sides, VerifyOptions, run_verify, same_code_note
from .features.profile.verify_result import VerifyResult

# Bad input to a twin, said in one line: raised from the twin the script called, not from the frames
# of ours that found it (the user's own exceptions keep their whole traceback)
_REFUSALS = (SettingError, TraceFileError, NotAResultFile)


def _refused_here(twin):
    @functools.wraps(twin)
    def checked(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841
        try:
            return twin(*args, **kwargs)
        except _REFUSALS as exc:
            raise exc.with_traceback(None) from None
    return checked


@_refused_here
def profile(fn: Callable[[], Any], *, steps: int = 1, warmup: int = 0, record_shapes: bool = False,
            memory: bool = False, stack: bool = False, flops: bool = False, trace: str | None = None,
            trace_overwrite: bool = False, sort: str = "auto", top: int = 15, device: Device | str | None = None,
            label: str | None = None, capture_budget: float | str | None = None,
            verify: Callable[[], Any] | None = None, expect: str | Expectation | None = None) -> ProfileResult:
    """Profile ``fn()`` (a training or inference step) and diagnose its bottlenecks.

    ``fn`` runs ``warmup`` times un-profiled, then ``steps`` times under torch.profiler,
    each step marked ``ProfilerStep#N`` and timed with the device synchronised.  If ``fn``
    raises, the profiler is stopped and the exception propagates with the partial profile
    attached as ``exc.torchmagic_result``.  ``trace``: a Chrome trace file to write, refused if a file
    is there unless ``trace_overwrite``.  ``capture_budget``: the host memory the profile may take, its
    events included once the profiler stops: bytes ("2GiB" or a number), or a fraction of the memory
    available (default 0.5); the steps stop before one that would pass it, with a note, and a budget
    that cannot hold one step raises ValueError.

    ``verify``: the step as it was before a finding's fix (``fn`` is the one with the fix): first the two run
    alternately in interleaved rounds, each block from the same state (put back afterwards), and
    ``result.verified`` (a VerifyResult) says whether the speedup is within ``expect`` (the finding's
    prediction, "1.00-1.27"), above, below, or inconclusive; then ``fn`` is profiled as without it.
    """
    __tracebackhide__ = True  # noqa: F841
    if isinstance(capture_budget, str):
        capture_budget = parse_budget_text("capture_budget", capture_budget)
    options = ProfileOptions(steps=steps, warmup=warmup, record_shapes=record_shapes, memory=memory,
                             stack=stack, flops=flops, trace=trace, trace_overwrite=trace_overwrite, sort=sort,
                             top=top, capture_budget=capture_budget)
    device = choose_device(device, referenced_values(fn))
    label = label or getattr(fn, "__name__", "profile")
    _check_verify(verify, expect, callable(verify))
    state = objects_used_by([*referenced_values(fn), *referenced_values(verify)]) if verify is not None else []
    verified = _verified(Sides(verify, fn, ("before", label)), expect, state, device) if verify is not None else None
    result = _profile(fn, options, label, device)
    result.verified = verified
    return result


def _profile(fn: Callable[[], Any], options: ProfileOptions, label: str, device: Device,
             user: UserSetup | None = None, code: str | None = None) -> ProfileResult:
    __tracebackhide__ = True  # noqa: F841
    return _finish(run_profile(fn, options, label=label, device=device, user=user, code=code))


@_refused_here
def profile_code(code: str, namespace: dict[str, Any] | None = None, **options) -> ProfileResult:
    """Profile a code string run in ``namespace`` (a fresh dict by default), as the magic does.

    Assignments the code makes stay in ``namespace``; ``options`` are those of :func:`profile`, where
    ``verify`` may also be the code before the fix as a string, or the ProfileResult of it (its code):
    ``profile_code(fixed, globals(), verify=prof, expect=prof.finding("optimizer").expected)``.
    """
    __tracebackhide__ = True  # noqa: F841
    cell = Cell(code)
    namespace = {} if namespace is None else namespace

    def step():
        __tracebackhide__ = True  # noqa: F841
        return cell.run(namespace)

    label, device = options.pop("label", None) or "code", options.pop("device", None)
    before, expect = options.pop("verify", None), options.pop("expect", None)
    _check_verify(before, expect, isinstance(before, str | ProfileResult) or callable(before))
    profile_options = ProfileOptions(**options)
    device = choose_device(device, values_named(cell.names, namespace))
    verified = _verified_code(before, (step, code, label), namespace, expect, device) if before is not None else None
    result = _profile(step, profile_options, label, device, user_setup(names_used(cell.names, namespace), usable_cores()),
                      code)
    result.verified = verified
    return result


def _verified_code(before, after: tuple[Callable[[], Any], str, str], namespace: dict[str, Any],
                   expect, device: Device) -> VerifyResult:
    """``profile_code``'s verify: ``before`` (code, the ProfileResult of a code, or a callable) against the code."""
    __tracebackhide__ = True  # noqa: F841
    step, code, label = after
    source = before.code if isinstance(before, ProfileResult) else before
    if source is None:
        raise SettingError("verify", "takes the profile of a code string or cell; this one was of a function")
    if isinstance(source, str):
        cell = Cell(source)
        names = cell.names | Cell(code).names

        def run_before():
            __tracebackhide__ = True  # noqa: F841
            return cell.run(namespace)
    else:
        names, run_before = Cell(code).names, source
    state = objects_used_by(values_named(names, namespace) + (referenced_values(source) if callable(source) else []))
    verified = _verified(Sides(run_before, step, ("before", label)), expect, state, device, namespace)
    if isinstance(source, str) and (note := same_code_note(source, code)):
        verified.notes.insert(0, note)
    return verified


def _check_verify(verify, expect, usable: bool) -> None:
    if verify is None and expect is not None:
        raise SettingError("expect", "goes with verify=: it is the prediction the verify judges")
    if verify is not None and not usable:
        raise SettingError("verify", f"takes the code before the fix (a callable; for profile_code also a string or "
                                     f"its ProfileResult), got a {type(verify).__name__}")


def _verified(sides: Sides, expect, state: list[Any], device: Device,
              namespace: dict[str, Any] | None = None) -> VerifyResult:
    __tracebackhide__ = True  # noqa: F841
    options = VerifyOptions(expect=as_expectation(expect))
    return _finish(run_verify(sides, options, state=state, device=device, namespace=namespace))


@_refused_here
def autobatch(step: Callable[[int], Any], *, budget: float | None = None, min: int = 1,  # noqa: A002
              max: int = 65536, multiple_of: int = 1, margin: float = 0.1,  # noqa: A002
              target_batch: int | None = None, throughput: bool = False, estimate: bool = True,
              restore: list[Any] | None = None,
              device: Device | str | None = None) -> AutobatchResult:
    """The largest batch size ``step(batch_size)`` runs with, predicted from a fitted memory law
    and verified by real runs; the answer always ran.

    ``budget``: bytes, or a fraction of memory (default 0.9 of the GPU's, 0.5 of available RAM on
    CPU), counted on top of what is in use now; ``margin`` is kept free below it.  The modules and
    optimizers the step uses (found in its closure and globals, or given as ``restore``) are put
    back afterwards, as is the random state: probing does not train the model.
    """
    __tracebackhide__ = True  # noqa: F841
    options = AutobatchOptions(budget=budget, min=min, max=max, multiple_of=multiple_of,
                               margin=margin, target_batch=target_batch, throughput=throughput,
                               estimate=estimate)
    state = restored_by_autobatch(step) if restore is None else restore
    device = choose_device(device, [*state, *referenced_values(step)])
    return _finish(run_autobatch(step, options, state=state, device=device,
                                 label=getattr(step, "__name__", "autobatch")))


@_refused_here
def compare(fn: Callable[..., Any], *, model: Any = None,
            variants: str | list[str | Variant] = DEFAULT_VARIANTS, runs: int | None = None,
            min_time: float = 1.0, warmup: int = 3, dtype: str | None = None, atol: float | None = None,
            rtol: float | None = None, restore: bool | list[Any] = True, device: Device | str | None = None,
            label: str | None = None, expect: str | Expectation | None = None) -> CompareResult:
    """Time ``fn`` under several execution variants and compare them with eager fp32.

    With ``model``, ``fn(m)`` is called with each variant's version of it (compiled, quantized,
    the model itself under autocast ...); without, ``fn()`` runs under each variant's context
    (amp, inference_mode, tf32).  ``fn`` returns the output the numerics check compares.
    Variants: names such as "eager,compile,amp,compile+amp" (see ``%%amp_compare?``) or
    :class:`~torchmagic.features.compare.variants.Variant` objects.  Rounds interleave the variants;
    each speedup (the median of per-round ratios) comes with a 95% CI.  The model, the optimizers holding its
    parameters (found in ``fn``'s globals) and the RNG are restored before each variant and
    afterwards; pass ``restore=[...]`` to name the objects, or ``False`` to skip it.  ``expect``
    ("1.15-1.30", a finding's prediction) needs one variant besides eager; ``.expectation_check``
    and the report say whether its speedup agrees.
    """
    __tracebackhide__ = True  # noqa: F841
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model= takes the nn.Module the variants change, got a {type(model).__name__}; "
                        "to time something else, call it from fn (with model=None)")
    options = CompareOptions(variants=tuple(parse_variants(variants)), runs=runs, min_time=min_time,
                             warmup=warmup, dtype=dtype, atol=atol, rtol=rtol, restore=restore is not False,
                             expect=as_expectation(expect))
    if isinstance(restore, list):
        state = restore
    else:
        state = restored_by_compare(model, referenced_values(fn), getattr(inspect.unwrap(fn), "__globals__", {}))
    call = fn if model is not None else (lambda _model: fn())
    device = choose_device(device, [model, *referenced_values(fn)])
    outcome = run_compare(Workload(call, model), options, state=state, device=device,
                          label=label or getattr(fn, "__name__", "compare"))
    code = getattr(inspect.unwrap(fn), "__code__", None)  # the same function's code, defined again or not
    if outcome.result is not None and outcome.error is None and code is not None:
        outcome.result.notes.extend(compared_again(outcome.result, code, model, "function"))
    return _finish(outcome)


def memory(namespace: dict[str, Any] | None = None, *, top: int = 10) -> MemoryResult:
    """Where memory is now: every GPU (NVML and torch's allocator), the host, and the variables of
    ``namespace`` (e.g. ``globals()``) that hold tensor memory, largest first."""
    from .features.memory.report import memory_report

    return memory_report(namespace, hidden=_ipython_hidden(namespace), top=top)


@_refused_here
def measure_memory(fn: Callable[[], Any], namespace: dict[str, Any] | None = None, *,
                   device: Device | str | None = None) -> MemoryResult:
    """Run ``fn()`` and report its peak and net allocations on the device (no peak counter is
    reset), and which variables of ``namespace`` hold the net memory.  If ``fn`` raises, the
    exception propagates with the result in ``exc.torchmagic_result``."""
    __tracebackhide__ = True  # noqa: F841
    from .features.memory.run import run_cell_memory

    device = choose_device(device, referenced_values(fn))
    return _finish(run_cell_memory(fn, {} if namespace is None else namespace, device=device))


def free(*names: str, namespace: dict[str, Any]) -> MemoryResult:
    """Delete ``names`` from ``namespace``, drop the output-history entries and the last traceback
    that hold their tensors, collect garbage and empty the caches; report what came back.  With
    no names, drop what only the output history or the last traceback holds."""
    from .features.memory.free import free as free_names

    return free_names(list(names), namespace, hidden=_ipython_hidden(namespace))


def _ipython_hidden(namespace: dict[str, Any] | None) -> set[str]:
    """IPython's own names (In, Out, exit, quit ...) when ``namespace`` is a notebook's globals():
    they are not the user's variables, and exit/quit reach the whole shell."""
    shell = current_shell()
    if shell is None or namespace is not getattr(shell, "user_ns", None):
        return set()
    return set(shell.user_ns_hidden)


def watch_memory(interval: float = 1.0):
    """Sample memory (and GPU utilisation) every ``interval`` seconds on a background thread;
    ``watch.stop()`` (or leaving a ``with`` block) ends it and returns the samples."""
    from .core.devices import visible_accelerators
    from .features.memory.watch import MemoryWatch

    return MemoryWatch(visible_accelerators(), interval).start()


@_refused_here
def loadertune(loader: Any, *, workers: list[int] | None = None, batches: int | None = None,
               seconds: float = 0.5, rounds: int = 6, step: Callable[[Any], Any] | None = None,
               restore: list[Any] | None = None, device: Device | str | None = None,
               expect: str | Expectation | None = None, **loader_kwargs):
    """The DataLoader settings that feed batches fastest: worker counts compared with persistent
    workers, then the fastest without them and with a deeper prefetch (``pin_memory`` with a GPU).

    ``loader`` is a DataLoader, or a dataset with DataLoader keyword arguments.  A change is
    recommended only when it is faster than the current settings with 95% confidence.  With
    ``step`` (a function taking a batch), the step is timed too, alone and with the loaders;
    the modules and optimizers it uses (or ``restore``) are put back afterwards.  ``expect``
    ("1.10-1.40", a finding's prediction): ``.expectation_check`` and the report say whether the
    recommended change (or, keeping the current settings, the fastest other) agrees.
    """
    from .features.loadertune.dataloader import as_loader
    from .features.loadertune.options import LoaderTuneOptions
    from .features.loadertune.run import run_loadertune
    from .features.loadertune.run import objects_to_restore as restored_by_loadertune

    options = LoaderTuneOptions(workers=tuple(workers) if workers else None, batches=batches, seconds=seconds,
                                rounds=rounds, expect=as_expectation(expect), step=step)
    state = restored_by_loadertune(step) if restore is None else restore
    device = choose_device(device, referenced_values(step) if step is not None else [])
    return _finish(run_loadertune(as_loader(loader, loader_kwargs), options, state=state, device=device,
                                  label=getattr(loader, "__name__", type(loader).__name__)))


@_refused_here
def analyze(source, *, label: str | None = None, operators: bool = True):
    """The traces a job wrote elsewhere, per rank and across ranks: a Chrome/Perfetto trace JSON
    (``.json`` or ``.json.gz``), a directory of per-rank traces as ``tensorboard_trace_handler``
    or ``export_chrome_trace`` write them, or a list of files.  Each file is read as a stream, in
    bounded memory; a rank is taken from the trace's ``distributedInfo``, else from ``rank<N>`` in
    its name.

    Returns a :class:`~torchmagic.features.profile.traces.result.TraceAnalysis`: ``.ranks`` (``rank``,
    ``step_s``, ``compute_s``, ``comm_s``, ``exposed_comm_s``, ``wait_s``, ``transfer_s``,
    ``dataloader_s`` ... in seconds per step), ``.straggler`` (the rank the others wait for, or
    None) and ``.findings``.  A job of one rank also gets ``.profile``, the report ``%%torchprofile``
    gives (operators, categories, findings, over every step: the trace is read into columns with the per-rank
    pass; one the columns do not cover, FLOPs recorded, over 300,000 events is read again, in groups of steps
    spilled to a temporary folder and summarised group after group), unless ``operators=False``.  A file that is not a trace raises
    ``TraceFileError`` (a ValueError) naming it.
    """
    __tracebackhide__ = True  # noqa: F841
    from .features.profile.traces.run import analyze_traces

    return analyze_traces(source, label=label, operators=operators)


def diff(before, after):
    """What changed between two profiles of one step, say before and after a fix: the step time's ratio
    (after / before) with a 95% confidence interval (from 4 profiled steps on each side), operators
    added, removed and changed (time and calls per step), the categories' shifts, and the findings
    that went away, appeared or stayed.  ``before`` and ``after`` are ProfileResults (a one-rank
    TraceAnalysis stands for its ``.profile``).  Returns a :class:`ProfileDiff`.
    """
    from .features.profile.diff import diff_profiles, step_problem

    sides = [_as_profile(before, "before"), _as_profile(after, "after")]
    for name, profile in zip(("before", "after"), sides):
        if (problem := step_problem(profile)) is not None:
            raise ValueError(f"torchmagic.diff: {name} ({profile.label}): {problem}")
    return diff_profiles(*sides)


@_refused_here
def load(path: str):
    """The result saved in ``path`` by ``result.save(path)`` (in this process or another, today or
    before): the same plain data, shown and compared (``diff(load("before.json"), after)``) as the
    one saved.  Raises ``ValueError`` with one line where the file holds no torchmagic result."""
    import os

    from .core.render import saved
    from .features.loadertune import result as _loadertune  # noqa: F401  (each result class registers itself)
    from .features.profile import diff as _diff  # noqa: F401
    from .features.profile.traces import result as _traces  # noqa: F401

    return saved.load(os.path.expanduser(os.fspath(path)))


def _as_profile(value, name: str) -> ProfileResult:
    from .features.profile.diff import profile_in

    profile = profile_in(value)  # a TraceAnalysis of one rank holds its ProfileResult
    if profile is None:
        raise TypeError(f"{name} must be a ProfileResult (from torchmagic.profile or %%torchprofile -o NAME), "
                        f"or the TraceAnalysis of one rank's trace; got {type(value).__name__}")
    return profile


@_refused_here
def profile_ranks(code: str, ranks: int, *, share: dict[str, Any] | None = None, backend: str | None = None,
                  steps: int = 1, warmup: int = 0, record_shapes: bool = False, trace: str | None = None,
                  trace_overwrite: bool = False, nnodes: int = 1, node_rank: int = 0, master: str | None = None,
                  label: str = "ranks"):
    """As ``%%torchprofile --ranks N``: run ``code`` once in each of ``ranks`` processes started as
    torchrun starts its workers (process group set up: gloo on CPU, NCCL with a GPU per rank), each
    under torch.profiler with ``prof`` in its namespace (a loop calls ``prof.step()``; ``warmup``
    steps, then ``steps`` recorded), and compare their traces.  ``share``: variables each rank gets
    (pickled); ``trace``: a directory to keep the per-rank traces in (rank files already there are
    refused unless ``trace_overwrite``).  A job over ``nnodes`` machines runs this on each, ``node_rank`` 0 to ``nnodes - 1``, with ``master`` the HOST:PORT of node 0
    (as torchrun's options): ``ranks`` per machine.  Each rank's output is printed as it comes,
    ``[rank R]`` first.  Returns the :class:`TraceAnalysis` of this machine's ranks; a rank that fails
    raises ``RankFailed`` after the others are stopped.
    """
    from .core.devices import nccl_gpus
    from .core.ranks import Node
    from .features.profile.traces.launch import RanksOptions, run_ranks

    options = RanksOptions(ranks=ranks, backend=backend, steps=steps, warmup=warmup, record_shapes=record_shapes,
                           trace_dir=trace, trace_overwrite=trace_overwrite, node=Node(nnodes, node_rank, master))
    return run_ranks(code, dict(share or {}), options, gpus=nccl_gpus(), label=label)


@_refused_here
def autobatch_ranks(code: str, ranks: int, *, step: str = "step", share: dict[str, Any] | None = None,
                    backend: str | None = None, budget: float | None = None, min: int = 1,  # noqa: A002
                    max: int = 65536, multiple_of: int = 1, margin: float = 0.1,  # noqa: A002
                    target_batch: int | None = None, throughput: bool = False, fresh: bool = False
                    ) -> AutobatchResult:
    """As ``%%autobatch --ranks N step``: ``code`` runs once in each of ``ranks`` processes (it wraps
    the model in DistributedDataParallel and defines ``step(batch_size)``), and every rank runs each
    trial: the answer is the per-rank batch size that fits on every rank (``.global_batch_size`` is
    times ``ranks``).  A rank that runs out of memory has every rank started again from ``code``.
    ``budget`` is per rank (a fraction: of its GPU, or of the RAM available, shared by the ranks on
    this machine); ``target_batch`` is global.  ``fresh`` (``--fresh``): each read of a trial is of
    the first steps of ranks started for it, as a script's first steps run.  Other options as
    :func:`autobatch`.
    """
    from .core.devices import nccl_gpus
    from .features.autobatch.ranks import RankJob, run_autobatch_ranks

    options = AutobatchOptions(budget=budget, min=min, max=max, multiple_of=multiple_of, margin=margin,
                               target_batch=target_batch, throughput=throughput, estimate=False, fresh=fresh)
    job = RankJob(code, ranks, step=step, shared=dict(share or {}), backend=backend, gpus=nccl_gpus())
    return _finish(run_autobatch_ranks(job, options, label=step))


def _finish(outcome: Outcome):
    """How every twin ends: the result, or the code's error (a Ctrl-C too) raised with what was
    measured before it as ``exc.torchmagic_result`` (where there is something)."""
    __tracebackhide__ = True  # noqa: F841
    if outcome.error is None:
        return outcome.result
    if outcome.result is not None:
        try:
            outcome.error.torchmagic_result = outcome.result
        except AttributeError:  # exception types with __slots__
            pass
    raise outcome.error
