"""The profiling engine: run a step under torch.profiler, summarise, diagnose.

It knows nothing of IPython: a step is any zero-argument callable (the magic passes
one that runs the cell).  On an exception in the step the profiler is stopped, what
ran is summarised, and the exception is handed back for the caller to re-raise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ...core.devices import Device, choose_device
from ...core.expectations import code_key
from ...core.devices.profiler import ensure_profiler_free, stop_profiler, without_profiler_banner
from ...core.interrupts import guards
from ...core.limits import SettingError, check_count, describe_error, usable_cores
from ...core.measure import timed_call
from ...core.outcome import Outcome
from ...core.render.format import fmt_us
from ...core.state import names_reached
from ...core.user_files import NewFile, check_new_file
from .activity import python_calls
from .allocations import allocation_report
from .modules import MODULE_MARK, module_labels
from .roofline import place_on_roofline
from .frames import frame_label, ipython_cell_files
from .result import SORT_KEYS, OpRow, ProfileResult
from .amp_estimate import estimate_amp
from .rules import (AllocatorCounters, RuleContext, amp_worth_estimating, diagnose, kernel_stats,
                    missing_kernels_note)
from .kineto import STEP_PREFIX
from .summary import TraceSummary
from .trace import summarize_trace
from .user import UserObjects, user_objects

HOT_LINES_KEPT = 50


@dataclass(frozen=True)
class ProfileOptions:
    steps: int = 1
    warmup: int = 0
    record_shapes: bool = False
    memory: bool = False
    stack: bool = False
    flops: bool = False
    trace: str | None = None
    trace_overwrite: bool = False  # replace a file already at ``trace`` (else refused)
    sort: str = "auto"
    top: int = 15

    def __post_init__(self):
        if self.steps < 1:
            raise SettingError("steps", f"must be at least 1, got {self.steps}")
        if self.warmup < 0:
            raise SettingError("warmup", f"must be 0 or more, got {self.warmup}")
        if self.top < 1:
            raise SettingError("top", f"must be at least 1, got {self.top}")
        for name in ("steps", "warmup", "top"):
            check_count(name, getattr(self, name))
        if self.sort != "auto" and self.sort not in SORT_KEYS:
            raise SettingError("sort", f"{self.sort!r} is an unknown sort key; choose from auto, {', '.join(SORT_KEYS)}")
        if self.trace is not None:
            check_new_file("trace", self.trace, self.trace_overwrite)

    def to_dict(self) -> dict:
        return asdict(self)


@guards
def run_profile(step: Callable[[], Any], options: ProfileOptions = ProfileOptions(), *,
                label: str = "profile", device: Device | None = None,
                user: UserObjects | None = None, code: str | None = None) -> Outcome[ProfileResult]:
    """Profile ``step``; the fixes name ``user``'s objects (default: those ``step`` reaches, by the
    names its code uses) and fit this machine's cores.  ``code``: the step's source (a cell's), whose
    verify commands' measurements (core/expectations.py) the rules read."""
    __tracebackhide__ = True  # noqa: F841
    ensure_profiler_free()
    device = device or choose_device()
    memory_before = device.allocator_stats()
    warmup_s: list[float] = []
    step_s: list[float] = []
    value, error, prof, history = None, None, None, None
    energy: list[int | None] = [None, None]  # the device's energy counter (mJ) around the profiled steps
    # With --memory the last warm-up run is recorded too (outside the steps' windows): torch's CPU profiler
    # reports no free of a block allocated before it started, so the gradients the first step's zero_grad
    # frees would stay in the level and the peak would read high by them.
    recorded_warmup = 1 if options.memory and options.warmup else 0
    try:
        for _ in range(options.warmup - recorded_warmup):
            value, seconds = timed_call(step, device)
            warmup_s.append(seconds)
        prof = torch.profiler.profile(
            activities=device.profiler_activities(),
            record_shapes=True,  # always: the amp rule needs input dtypes; shapes show on request
            profile_memory=options.memory,
            with_stack=options.stack or options.memory,  # an allocation's Python stack: who made it
            with_flops=options.flops,
        )
        recorder = device.allocation_history() if options.memory else contextlib.nullcontext()
        with without_profiler_banner():  # one scope a line: a Ctrl-C between two is inside the first
            with recorder as history:
                try:
                    prof.start()
                    for _ in range(recorded_warmup):
                        value, seconds = timed_call(step, device)
                        warmup_s.append(seconds)
                    energy[0] = device.energy_mj()
                    for i in range(options.steps):
                        value, seconds = timed_call(step, device, marker=f"{STEP_PREFIX}{i}")
                        step_s.append(seconds)
                    energy[1] = device.energy_mj()
                finally:
                    stop_profiler(prof)
    except BaseException as exc:  # noqa: BLE001  (KeyboardInterrupt too: summarise, then re-raise)
        error = exc
    ctx = rule_context(device, user or user_objects(names_reached(step), usable_cores()), memory_before, code)
    result = _build_result(prof, options, label, device, warmup_s, step_s, error, ctx, history)
    _energy(result, *energy)
    return Outcome(result, value, error)  # the value: the last completed step's


def measured_nothing(result: ProfileResult) -> bool:
    """The code failed before any of it was measured: no warm-up run or step finished and the profiler
    saw no operator (a NameError on a cell's first line).  A report of that is clutter around the error,
    and a trace of it would take the --trace path from the run that follows the fix."""
    return not result.step_s and not result.warmup_s and not result.ops


ENERGY_MIN_S = 1.0  # NVML refreshes its counter every few to tens of ms: shorter windows read coarsely


def _energy(result: ProfileResult, before: int | None, after: int | None) -> None:
    """Joules per profiled step from NVML's energy counter, with how far to trust it."""
    if before is None or after is None or not result.step_s or after < before:
        return
    result.energy_j_per_step = (after - before) / 1000 / len(result.step_s)
    window = sum(result.step_s)
    if window < ENERGY_MIN_S:
        result.notes.append(f"Energy: the profiled steps took {window * 1e3:.0f} ms, against NVML's counter "
                            "refreshed every few to tens of ms: profile more steps for a figure to trust.")


def rule_context(device: Device, user: UserObjects = UserObjects(), before=None,
                 code: str | None = None) -> RuleContext:
    """What the rules may know of the device: its capabilities and, with the allocator's counters
    from ``before`` the steps, their memory; with the profiled ``code``, what its verifies measured."""
    low = device.low_precision()
    after = device.allocator_stats()
    retries, counters = 0, None
    if before is not None and after is not None:
        retries = after.num_alloc_retries - before.num_alloc_retries
        # the steps' own peak is read from these and the trace's memory events: rules.step_peak says how
        counters = AllocatorCounters(total=device.memory_capacity()[1],
                                     allocated_before=before.allocated_bytes, allocated_after=after.allocated_bytes,
                                     peak_before=before.peak_allocated_bytes, peak_after=after.peak_allocated_bytes,
                                     device=device.label)
    return RuleContext(device_type=device.kind, low_precision_fast=low.fast,
                       low_precision_dtype=str(low.dtype).removeprefix("torch.") if low.dtype else None,
                       low_precision_reason=low.reason, accelerator=device.is_accelerator,
                       traces_kernels=device.traces_kernels,
                       captures_cuda_graphs=device.captures_cuda_graphs, autocast_keeps=device.autocast_keeps,
                       user=user, alloc_retries=retries, allocator=counters,
                       code=code_key(code) if code is not None else None)


def _build_result(prof, options, label, device, warmup_s, step_s, error, ctx: RuleContext,
                  history=None) -> ProfileResult:
    notes = [note for note in (device.choice_note(), device.profile_note()) if note]
    if options.warmup == 0:
        notes.append("The first run includes one-time costs (lazy initialisation, allocator warm-up); "
                     "--warmup 1 leaves them out.")
        if options.memory and not device.is_accelerator:
            notes.append("--memory: torch's CPU profiler reports no free of memory allocated before it started, "
                         "so the peak reads high by what the first step frees of earlier tensors (the gradients "
                         "zero_grad drops); with --warmup 1 it is exact.")
    nvml = device.nvml()
    if isinstance(nvml, str):
        notes.append(nvml)
        nvml = None
    result = ProfileResult(
        label=label, device=device.describe(), step_s=step_s, warmup_s=warmup_s,
        notes=notes, nvml=nvml.to_dict() if nvml is not None else None,
        error=_error_text(error), options=options.to_dict(),
    )
    unprofiled = warmup_s[:options.warmup - 1] if options.memory else warmup_s  # see recorded_warmup
    if len(unprofiled) >= 2 and step_s:
        # the first warm-up run is cold; the others are the un-profiled baseline
        result.overhead = statistics.median(step_s) / statistics.median(unprofiled[1:])
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:
        if error is None:
            result.notes.append("The profiler returned no events.")
        return result
    started = time.perf_counter()
    summary = summarize_trace(results.events(), results.trace_start_ns(), shapes=options.record_shapes,
                              flops=options.flops, python_calls=python_calls(results) if options.stack else ())
    if ctx.low_precision_fast and amp_worth_estimating(summary):  # the flags allow it: measure whether it is
        dtype = getattr(torch, ctx.low_precision_dtype or "bfloat16")
        try:
            ctx = dataclasses.replace(ctx, amp_estimate=estimate_amp(summary, device, dtype))
        except Exception as exc:  # noqa: BLE001 - the device refused the re-timing: the finding goes unpredicted
            result.notes.append(f"amp: the step's matmuls could not be re-timed in {dtype} here "
                                f"({describe_error(exc)}): no predicted speedup.")
    fill_from_summary(result, summary, ctx)
    tree = results.experimental_event_tree() if options.memory or options.stack else None
    if options.memory and summary.step_start_us:
        first_step_ns = results.trace_start_ns() + round(summary.step_start_us[0] * 1000)
        last_step_ns = results.trace_start_ns() + round((summary.step_start_us[-1] + summary.step_us[-1]) * 1000)
        result.memory_timeline, result.largest_allocations = allocation_report(
            tree, first_step_ns, last_step_ns, ipython_cell_files(),
            history.allocations if history is not None else None)
        if history is not None and history.note:
            result.notes.append(history.note)
    if tree is not None:
        _name_modules(result, module_labels(tree, ctx.user.module_paths))
    if options.flops:
        place_on_roofline(result, device)
    result.analysis_s = time.perf_counter() - started
    if options.trace and not measured_nothing(result):
        try:
            with NewFile(options.trace, options.trace_overwrite) as trace:
                prof.export_chrome_trace(trace.temp)
                trace.publish()
            result.trace_path = os.path.abspath(options.trace)
        except Exception as exc:  # disk full, permissions: the profile itself is still good
            result.notes.append(f"Could not write the trace to {options.trace}: {describe_error(exc)}")
    # The profiler object sits in reference cycles, so only the cyclic GC would free it, at some
    # later moment in the user's code, along with the events it holds (~0.3 s for 100k events).
    # Free them now, inside the time the magic reports.
    prof.profiler.kineto_results = None
    return result


def _name_modules(result: ProfileResult, labels: dict[str, str]) -> None:
    """The model's names for its modules where the tracer wrote "nn.Module: Linear_3" (modules.py)."""
    result.hot_lines = [(labels.get(label, label), us) for label, us in result.hot_lines]
    result.largest_allocations = [
        dataclasses.replace(a, module=labels[MODULE_MARK + a.module][len(MODULE_MARK):])
        if a.module and MODULE_MARK + a.module in labels else a for a in result.largest_allocations]


def fill_from_summary(result: ProfileResult, s: TraceSummary, ctx: RuleContext) -> None:
    result.findings = diagnose(s, ctx)
    if note := missing_kernels_note(s, ctx):
        result.notes.append(note)
    if s.one_time_us:
        costs = ", ".join(f"{kind} {fmt_us(us)}" for kind, us in
                          sorted(s.one_time_us.items(), key=lambda kv: -kv[1]))
        result.notes.append(f"One-time costs in the profiled steps, shown as start-up and kept out of the findings' "
                            f"shares: {costs}. Profile after a warm-up step (--warmup 1) to see the steady state alone.")
    if s.profiler_start_us:
        result.notes.append(f"The first profiled step took {fmt_us(s.profiler_start_us)} more than the others' median: "
                            "the profiler starting to trace the GPU, kept out of the findings' shares.")
    result.event_count = s.event_count
    result.ops = [
        OpRow(o.name, o.calls, o.self_cpu_us, o.total_cpu_us, o.self_device_us, o.flops,
              o.allocated_bytes, tuple(o.top_shapes()), bytes=o.bytes, dtype=o.dtype,
              estimated_flops=o.estimated_flops, flop_device_us=o.flop_device_us)
        for o in s.ops.values()
    ]
    # Python between ops shows as the step markers' own time: count it under "other"
    result.categories_s = {k: v / 1e6 for k, v in s.category_us.items() if v > 0}
    result.device_categories_s = {k: v / 1e6 for k, v in s.device_category_us.items() if v > 0}
    result.timeline = s.timeline
    result.step_starts_us = list(s.step_start_us)
    result.memory_peak_bytes = dict(s.peak_allocated)
    result.kernel_stats = kernel_stats(s)
    result.memory_allocated_bytes = dict(s.allocated_total)
    cells = ipython_cell_files()
    result.hot_lines = [(frame_label(frame, cells), us) for frame, us in s.hot_lines.most_common(HOT_LINES_KEPT)]
    if s.steps > len(result.step_s):
        result.notes.append("The last profiled step did not finish; it is included up to the failure.")


def _error_text(error: BaseException | None) -> str | None:
    return None if error is None else describe_error(error, width=10_000)
