"""A profile's result, built once from what the engine measured.

The engine (run.py) hands over plain data: its timings, the profiler and the rules' view of the device.
Each part of the report is computed here as fields, and the ``ProfileResult`` is made from them in one
call; a trace file's reader (traces/ops.py) builds its result from the same summary fields.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from ...core.devices import Device
from ...core.limits import describe_error
from ...core.measure.stats import unpaired_ratio
from ...core.user_files import NewFile
from .activity import python_calls
from .allocations import allocation_report
from .amp_estimate import estimate_amp
from .frames import ipython_cell_files
from .modules import MODULE_MARK, module_labels
from .options import ProfileOptions
from .result import OpRow, ProfileResult
from .roofline import roofline_fields
from .rules import RuleContext, amp_worth_estimating
from .summary import TraceSummary
from .summary_fields import summary_fields
from .live_table import summarize_live

ENERGY_MIN_S = 1.0  # NVML refreshes its counter every few to tens of ms: shorter windows read coarsely


@dataclass
class Measured:
    """What one profiling run measured, as the engine hands it to the builder."""

    label: str
    options: ProfileOptions
    device: Device
    ctx: RuleContext                 # what the rules may know of the device, the user's objects and code
    warmup_s: list[float]
    step_s: list[float]
    error: BaseException | None = None
    history: Any = None              # the allocator's history (--memory on a device that records one)
    energy_mj: tuple[int | None, int | None] = (None, None)  # the device's energy counter around the steps
    capture_note: str | None = None  # the capture budget stopped the steps early: why (budget.py)
    capture_bytes: int | None = None  # host memory the process took while profiling, before the stop
    code: str | None = None          # the profiled code's source, where it is a cell's or a string's


def build_profile(prof, m: Measured) -> ProfileResult:
    """The result of a run whose profiler is ``prof`` (None: it never started); frees the profiler's events."""
    notes = _setup_notes(m)
    nvml = m.device.nvml()
    if isinstance(nvml, str):
        notes.append(nvml)
        nvml = None
    fields: dict[str, Any] = dict(
        label=m.label, device=m.device.describe(), step_s=m.step_s, warmup_s=m.warmup_s,
        nvml=nvml.to_dict() if nvml is not None else None, error=_error_text(m.error),
        options=m.options, capture_bytes=m.capture_bytes, code=m.code, **_overhead(m))
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is not None:
        fields.update(_analysed(prof, results, m, notes))
    elif m.error is None:
        notes.append("The profiler returned no events.")
    fields.update(_energy_fields(m.energy_mj, m.step_s, notes))
    return ProfileResult(notes=notes, **fields)


def nothing_measured(step_s: list[float], warmup_s: list[float], ops: list[OpRow]) -> bool:
    """No warm-up run or step finished and the profiler saw no operator (run.measured_nothing says why)."""
    return not step_s and not warmup_s and not ops


def _setup_notes(m: Measured) -> list[str]:
    notes = [note for note in (m.device.choice_note(), m.device.profile_note(), m.capture_note) if note]
    if m.options.warmup == 0:
        notes.append("The first run includes one-time costs (lazy initialisation, allocator warm-up); "
                     "--warmup 1 leaves them out.")
        if m.options.memory and not m.device.is_accelerator:
            notes.append("--memory: torch's CPU profiler reports no free of memory allocated before it started, "
                         "so the peak reads high by what the first step frees of earlier tensors (the gradients "
                         "zero_grad drops); with --warmup 1 it is exact.")
    return notes


def _overhead(m: Measured) -> dict[str, Any]:
    """Profiled over un-profiled step time with its 95% interval, where there are enough runs on both sides
    for one (4 each: --warmup 5, --steps 4); none else: one un-profiled run against a few profiled ones read
    anywhere from 0.4x to 1.7x on an idle machine, noise given as a figure."""
    unprofiled = m.warmup_s[:m.options.warmup - 1] if m.options.memory else m.warmup_s  # run.recorded_warmup
    baseline = unprofiled[1:]  # the first warm-up run is cold
    if not baseline or not m.step_s or min(baseline + m.step_s) <= 0:
        return {}
    ratio = unpaired_ratio(m.step_s, baseline)
    return {"overhead": ratio.estimate, "overhead_ci": ratio.ci} if ratio.ci is not None else {}


def _analysed(prof, results, m: Measured, notes: list[str]) -> dict[str, Any]:
    """The fields read from the profiler's events (read into the columns a trace file is read into, and
    analysed as a file is: live_table.py): summary, findings, memory, modules, roofline, trace file."""
    started = time.perf_counter()
    options = m.options
    read = summarize_live(results, shapes=options.record_shapes, flops=options.flops,
                          python_calls=python_calls(results) if options.stack else ())
    if read is None:
        notes.append("The profiler returned no events.")
        fields: dict[str, Any] = {"ops": []}
    else:
        fields = _summarized(*read, results, m, notes)
    fields["analysis_s"] = time.perf_counter() - started
    if options.trace and not nothing_measured(m.step_s, m.warmup_s, fields["ops"]):
        fields["trace_path"] = _export_trace(prof, options, notes)
    # The profiler object sits in reference cycles, so only the cyclic GC would free it, at some
    # later moment in the user's code, along with the events it holds (~0.3 s for 100k events).
    # Free them now, inside the time the magic reports.
    prof.profiler.kineto_results = None
    return fields


def _summarized(summary: TraceSummary, first_ns: int, results, m: Measured, notes: list[str]) -> dict[str, Any]:
    """The fields of a profile's summary (``first_ns``: the profiler clock at its time zero, its first event)."""
    options = m.options
    ctx = _with_amp_estimate(m.ctx, summary, m.device, notes)
    fields = summary_fields(summary, ctx, len(m.step_s), notes)
    if m.error is not None and not m.step_s:  # a fragment of a step that failed is no step to diagnose
        fields["findings"] = []
        notes.append("No findings: the cell raised before a profiled step finished, and what ran of it is not "
                     "the step its fix would change (fix the error, then profile again).")
    tree = results.experimental_event_tree() if options.memory or options.stack else None
    if options.memory and summary.step_start_us:
        first_step_ns = first_ns + round(summary.step_start_us[0] * 1000)
        last_step_ns = first_ns + round((summary.step_start_us[-1] + summary.step_us[-1]) * 1000)
        fields["memory_timeline"], fields["largest_allocations"] = allocation_report(
            tree, first_step_ns, last_step_ns, ipython_cell_files(),
            m.history.allocations if m.history is not None else None)
        if m.history is not None and m.history.note:
            notes.append(m.history.note)
    if tree is not None:
        fields.update(_named_modules(fields, module_labels(tree, ctx.user.module_paths)))
    if options.flops:
        fields.update(roofline_fields(fields["ops"], m.step_s, m.device, notes))
    return fields


def _with_amp_estimate(ctx: RuleContext, summary: TraceSummary, device: Device, notes: list[str]) -> RuleContext:
    """``ctx`` with the step's matmuls re-timed in low precision, where the flags allow it and it is worth it."""
    if not (ctx.low_precision_fast and amp_worth_estimating(summary)):
        return ctx
    dtype = getattr(torch, ctx.low_precision_dtype or "bfloat16")
    try:
        return dataclasses.replace(ctx, amp_estimate=estimate_amp(summary, device, dtype))
    except Exception as exc:  # noqa: BLE001 - the device refused the re-timing: the finding goes unpredicted
        notes.append(f"amp: the step's matmuls could not be re-timed in {dtype} here "
                     f"({describe_error(exc)}): no predicted speedup.")
        return ctx


def _named_modules(fields: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """The model's names for its modules where the tracer wrote "nn.Module: Linear_3" (modules.py)."""
    return dict(
        hot_lines=[(labels.get(label, label), us) for label, us in fields["hot_lines"]],
        largest_allocations=[
            dataclasses.replace(a, module=labels[MODULE_MARK + a.module][len(MODULE_MARK):])
            if a.module and MODULE_MARK + a.module in labels else a
            for a in fields.get("largest_allocations", [])])


def _export_trace(prof, options: ProfileOptions, notes: list[str]) -> str | None:
    try:
        with NewFile(options.trace, options.trace_overwrite) as trace:
            prof.export_chrome_trace(trace.temp)
            trace.publish()
        return os.path.abspath(options.trace)
    except Exception as exc:  # disk full, permissions: the profile itself is still good
        notes.append(f"Could not write the trace to {options.trace}: {describe_error(exc)}")
        return None


def _energy_fields(energy_mj: tuple[int | None, int | None], step_s: list[float], notes: list[str]) -> dict:
    """Joules per profiled step from NVML's energy counter, with how far to trust it."""
    before, after = energy_mj
    if before is None or after is None or not step_s or after < before:
        return {}
    window = sum(step_s)
    if window < ENERGY_MIN_S:
        notes.append(f"Energy: the profiled steps took {window * 1e3:.0f} ms, against NVML's counter "
                     "refreshed every few to tens of ms: profile more steps for a figure to trust.")
    return {"energy_j_per_step": (after - before) / 1000 / len(step_s)}


def _error_text(error: BaseException | None) -> str | None:
    return None if error is None else describe_error(error, width=10_000)
