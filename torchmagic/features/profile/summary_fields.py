"""The result's fields that come from a trace's summary, for a live profile (build.py) and a trace file
(traces/ops.py) alike: findings, notes on what the trace lacks, the operator table, categories, timeline."""

from __future__ import annotations

from typing import Any

from ...core.render.format import fmt_us
from .frames import frame_label, ipython_cell_files
from .result import OpRow
from .rules import RuleContext, diagnose, kernel_stats, lost_events_note, missing_kernels_note
from .summary import TraceSummary, largest

HOT_LINES_KEPT = 50


def summary_fields(s: TraceSummary, ctx: RuleContext, steps_timed: int, notes: list[str]) -> dict[str, Any]:
    """The result's fields that come from a trace's summary, its findings first; ``steps_timed``: the steps
    whose time was measured (one fewer than the summary's when the last did not finish)."""
    findings = diagnose(s, ctx)
    for note in (missing_kernels_note(s, ctx), lost_events_note(s)):
        if note:
            notes.append(note)
    if s.one_time_us:
        costs = ", ".join(f"{kind} {fmt_us(us)}" for kind, us in
                          largest(s.one_time_us))
        notes.append(f"One-time costs in the profiled steps, shown as start-up and kept out of the findings' "
                     f"shares: {costs}. Profile after a warm-up step (--warmup 1) to see the steady state alone.")
    if s.profiler_start_us:
        notes.append(f"The first profiled step took {fmt_us(s.profiler_start_us)} more than the others' median: "
                     "the profiler starting to trace the GPU, kept out of the findings' shares.")
    if s.steps > steps_timed:
        notes.append("The last profiled step did not finish; it is included up to the failure.")
    cells = ipython_cell_files()
    return dict(
        findings=findings, event_count=s.event_count, kernels_without_launch=s.kernels_without_launch,
        launches_without_kernel=s.launches_without_kernel, ops=[_op_row(o) for o in s.ops.values()],
        # Python between ops shows as the step markers' own time: count it under "other"
        categories_s={k: v / 1e6 for k, v in s.category_us.items() if v > 0},
        device_categories_s={k: v / 1e6 for k, v in s.device_category_us.items() if v > 0},
        timeline=s.timeline, step_starts_us=list(s.step_start_us), memory_peak_bytes=dict(s.peak_allocated),
        kernel_stats=kernel_stats(s), memory_allocated_bytes=dict(s.allocated_total),
        hot_lines=[(frame_label(frame, cells), us) for frame, us in largest(s.hot_lines, HOT_LINES_KEPT)])


def _op_row(o) -> OpRow:
    return OpRow(o.name, o.calls, o.self_cpu_us, o.total_cpu_us, o.self_device_us, o.flops,
                 o.allocated_bytes, tuple(o.top_shapes()), bytes=o.bytes, dtype=o.dtype,
                 estimated_flops=o.estimated_flops, flop_device_us=o.flop_device_us)
