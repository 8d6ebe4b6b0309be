"""Diagnosis rules: small pure functions from a :class:`TraceSummary` to findings, one module per family.

Every threshold lives in :data:`THRESHOLDS` (findings.py).  A rule returns ``None`` or one
:class:`~torchmagic.features.profile.result.Finding`.  Rules read only the summary and a
:class:`RuleContext` (context.py: what the device can do), so they are tested on real CPU profiles
and on summaries built from numbers.  The families: the input pipeline (input_pipeline.py), the host
holding the step back (host_overhead.py), how the GPU's work comes in (gpu_work.py), precision
(precision.py), memory (memory.py), and work a setting removes (avoidable_work.py).
"""

from __future__ import annotations

from collections.abc import Callable

from ..result import Finding
from ..summary import TraceSummary
from .avoidable_work import inference_grad, optimizer
from .context import AllocatorCounters, RuleContext
from .findings import THRESHOLDS, VERIFY, VERIFY_NAMES, severity
from .gpu_work import gpu_idle, kernel_stats, lost_events_note, missing_kernels_note
from .host_overhead import dispatch_bound, sync
from .input_pipeline import dataloader
from .memory import batch_size, copies, step_peak
from .precision import amp, amp_worth_estimating, tensor_core_alignment

__all__ = ["THRESHOLDS", "VERIFY", "VERIFY_NAMES", "AllocatorCounters", "RuleContext", "RULES", "diagnose",
           "severity", "step_peak", "kernel_stats", "missing_kernels_note", "lost_events_note", "amp_worth_estimating",
           "dataloader", "sync", "dispatch_bound", "amp", "copies", "inference_grad", "optimizer", "batch_size",
           "tensor_core_alignment", "gpu_idle"]

RULES: tuple[Callable[[TraceSummary, RuleContext], Finding | None], ...] = (
    dataloader, sync, dispatch_bound, amp, copies, inference_grad, optimizer, batch_size, tensor_core_alignment,
)


def diagnose(summary: TraceSummary, ctx: RuleContext) -> list[Finding]:
    """All findings for a profile, most costly first."""
    if summary.steps == 0 or summary.steady_step_us <= 0:
        return []
    found = [f for rule in RULES if (f := rule(summary, ctx)) is not None]
    idle = gpu_idle(summary, ctx, found)  # judged last: it names the findings that explain the GPU's idle time
    if idle is not None:
        found.append(idle)
    return sorted(found, key=lambda f: (f.severity.rank, -f.share))
