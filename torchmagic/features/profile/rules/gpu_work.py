"""How the GPU's work comes in: its idle time, the share it waits for the host's launches, its kernels'
statistics, a CUDA profile with no kernels at all, and one that lost some."""

from __future__ import annotations

import statistics

from ....core.expectations import Expectation
from ..result import Finding
from ..summary import TraceSummary
from .context import RuleContext
from .findings import THRESHOLDS, Advice, make_finding


def gpu_waiting_share(s: TraceSummary, ctx: RuleContext) -> float | None:
    """On a GPU trace, the share of the step the GPU sits idle for want of launches: idle time less the
    loading it idles through (the dataloader rule's); None where the trace has no kernels to tell by."""
    steady = s.steady_step_us
    if not ctx.traces_kernels or not s.has_device_events or steady <= 0:
        return None
    idle = max(steady - s.device_busy_us - (s.data_exposed_us or 0.0), 0.0)
    return idle / steady


def gpu_idle(s: TraceSummary, ctx: RuleContext, others: list[Finding] = ()) -> Finding | None:
    steady = s.steady_step_us
    if not ctx.traces_kernels or not s.has_device_events or steady <= 0:
        return None
    idle = max(steady - s.device_busy_us, 0.0)
    share = idle / steady
    if share < THRESHOLDS["gpu_idle_share"]:
        return None
    causes = [f.rule for f in others if f.rule in ("dataloader", "sync", "dispatch_bound", "copies")]
    because = f"; likely causes found above: {', '.join(causes)}" if causes else ""
    return make_finding(
        "gpu_idle", ctx, share,
        f"The GPU is idle {share:.0%} of the step{because}",
        {"idle_ms_per_step": round(idle / s.steps / 1e3, 3), "busy_ms_per_step":
         round(s.device_busy_us / s.steps / 1e3, 3), "kernels": s.device_kernels, "causes": causes,
         **{k: round(v, 3) for k, v in kernel_stats(s).items()}},
        Advice("Keep the GPU fed: fix the causes listed, then batch more work per launch "
               "(larger batches, torch.compile, CUDA graphs).",
               f"{ctx.user.model} = torch.compile({ctx.user.model}, mode='reduce-overhead')"
               "  # CUDA graphs for static shapes",
               Expectation.removing(share, "the GPU's idle time")),
    )


def kernel_stats(s: TraceSummary) -> dict[str, float]:
    """How the GPU's work came in: kernels per step, their median length, how many (and how much of the
    kernel time) are shorter than ``short_kernel_us``, and the median wait from launch call to start."""
    if not s.kernel_us or not s.steps:
        return {}
    short = [us for us in s.kernel_us if us < THRESHOLDS["short_kernel_us"]]
    stats = {"kernels_per_step": len(s.kernel_us) / s.steps, "median_kernel_us": statistics.median(s.kernel_us),
             "short_kernel_share": len(short) / len(s.kernel_us), "short_kernel_time_share": sum(short) / sum(s.kernel_us)}
    if s.launch_delay_us:
        stats["median_launch_delay_us"] = statistics.median(s.launch_delay_us)
    return stats


def missing_kernels_note(s: TraceSummary, ctx: RuleContext) -> str | None:
    """One line for a CUDA profile whose steps ran ops that launch kernels, but whose trace has none.
    The device is where the code's tensors live, so its ops ran there and CUPTI (the source of every
    kernel and runtime event) recorded nothing; unless the device was a guess (the code named no
    tensor) and the ops ran on the CPU."""
    if not ctx.traces_kernels or s.has_device_events or s.launching_ops == 0:
        return None
    return (f"No GPU kernels in this profile of a CUDA device, though its steps ran {s.launching_ops} ops: CUPTI "
            "recorded none (another profiler such as Nsight attached, or no CUPTI access in this container), "
            "or the ops ran on the CPU (then --device cpu); the GPU rules (GPU idle time, small batch, amp by "
            "kernel time) were skipped.")


def lost_events_note(s: TraceSummary) -> str | None:
    """One line where the trace lost kernels or their launches: a profile of a process that profiled
    before loses some at each start (pytorch#192021), so its GPU figures are short of the run's."""
    parts = []
    if s.kernels_without_launch:
        parts.append(f"{s.kernels_without_launch:,} of {s.device_kernels:,} kernels and copies have no launch in "
                     "the trace")
    if s.launches_without_kernel:
        parts.append(f"{s.launches_without_kernel:,} of {s.kernel_launches:,} kernel launches in the steps have "
                     "no kernel")
    if not parts:
        return None
    return (f"Events lost: {' and '.join(parts)}. A profiler started again in one process loses kernel events "
            "at each start (pytorch#192021), so the GPU figures above are incomplete: restart the kernel (the "
            "process) and profile once for a complete profile.")
