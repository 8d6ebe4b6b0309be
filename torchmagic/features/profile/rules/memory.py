"""Memory: copies and conversions in the step (pageable host-to-device copies among them), and the
allocator's view of the batch: pressure near the device's size, or a small batch on a mostly idle GPU."""

from __future__ import annotations

from ....core.expectations import Expectation
from ..result import Finding
from ..summary import TraceSummary
from .context import RuleContext
from .findings import THRESHOLDS, Advice, fmt_per_step, make_finding, share_of_step
from .gpu_work import gpu_waiting_share


def copies(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """Copies and conversions on the host, or pageable host-to-device copies on the GPU, each judged on
    its own time: a pageable copy that takes no time is not worth pinning memory for."""
    share = share_of_step(s.copy_us, s)
    pageable = s.pageable_h2d / s.steps
    pageable_share = share_of_step(s.pageable_h2d_us, s)
    pinning_pays = (pageable >= THRESHOLDS["pageable_h2d_per_step"]
                    and pageable_share >= THRESHOLDS["pageable_h2d_share"])
    host_share, starved = share, gpu_waiting_share(s, ctx)
    if starved is not None:
        share = min(share, starved)  # a host-side copy costs a GPU step only the time the GPU waits for it
    if share < THRESHOLDS["copies_share"] and not pinning_pays:
        return None
    parts = []
    if pinning_pays:
        parts.append("host-to-device copies from pageable memory: pin the batch and copy with non_blocking=True")
    if s.layout_copies:
        parts.append(f"{s.layout_copies} .contiguous() layout conversions: keep one memory format "
                     "(channels_last for convolution models)")
    parts.append("move dtype/device conversions out of the loop: create tensors where and as they are used")
    pinned = (f"{fmt_per_step(pageable)} host-to-device cop{'y' if pageable == 1 else 'ies'} per step from "
              f"pageable memory take {pageable_share:.0%} of the step on the GPU")
    if share >= THRESHOLDS["copies_share"]:
        title = f"Copies and conversions take {host_share:.0%} of the step"
        if share < host_share:
            title += f" on the host; the GPU waits on the host {share:.0%}"
        title += f"; {pinned}" if pinning_pays else ""
    else:
        title = pinned[0].upper() + pinned[1:]
    removed = max(share, pageable_share if pinning_pays else 0.0)
    return make_finding(
        "copies", ctx, removed, title,
        {"copies_ms_per_step": round(s.copy_us / s.steps / 1e3, 3), "share_of_step": round(share, 4),
         "pageable_h2d_per_step": round(pageable, 2),
         "pageable_h2d_ms_per_step": round(s.pageable_h2d_us / s.steps / 1e3, 3), "contiguous_calls": s.layout_copies},
        Advice("; ".join(parts) + ".",
               f"{ctx.user.loader} = DataLoader({ctx.user.loader}.dataset, batch_size={ctx.user.loader}.batch_size, "
               "pin_memory=True)\n"
               "x = x.to(device, non_blocking=True)\n"
               f"{ctx.user.model} = {ctx.user.model}.to(memory_format=torch.channels_last)   # conv nets",
               Expectation.removing(removed, "the copies' time" if starved is None
                                    else "the time the GPU waits on them")),
    )


def step_peak(s: TraceSummary, ctx: RuleContext) -> tuple[int, int] | None:
    """The profiled steps' peak allocated bytes on the GPU, as (at least, at most).

    The allocator's peak counter is the user's and is not reset, so the peak is read where it is known:
    * with the profiler's memory events (--memory), exactly: the level at the profile's start (allocated
      after it, less what it allocated net) plus the highest level the events reach above it;
    * else, if the high-water mark rose, the cell's runs (warm-up and profiled: the same code) set it;
    * else only bounds: what was held around the runs, and the older high-water mark.
    """
    a = ctx.allocator
    if a is None:
        return None
    if s.memory_recorded:
        start = max(a.allocated_after - s.allocated_net.get(a.device, 0), 0)
        peak = start + s.peak_allocated.get(a.device, 0)
        return peak, peak
    if a.peak_after > a.peak_before:
        return a.peak_after, a.peak_after
    return max(a.allocated_before, a.allocated_after), a.peak_before


def batch_size(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """Memory pressure (the allocator had to flush its cache, or the step's peak nearly fills the device),
    or the opposite: a batch so small the device idles with most of its memory unused.  Where only
    bounds of the peak are known (see :func:`step_peak`), pressure needs the lower bound high and a
    small batch the upper bound low."""
    peak = step_peak(s, ctx)  # None without the allocator's counters (a GPU's)
    if peak is None or ctx.allocator.total <= 0:
        return None
    least, most = (p / ctx.allocator.total for p in peak)
    evidence = {"alloc_retries": ctx.alloc_retries, "peak_fraction": round(least, 3)}
    if most != least:
        evidence["peak_fraction_at_most"] = round(most, 3)
    if ctx.alloc_retries > 0 or least >= THRESHOLDS["batch_pressure_peak_fraction"]:
        why = (f"the allocator flushed its cache and retried {ctx.alloc_retries} times (each a cudaFree and a "
               "synchronisation)" if ctx.alloc_retries else f"the step's peak reaches {least:.0%} of the GPU's memory")
        return make_finding(
            "batch_size", ctx, 0.10 if ctx.alloc_retries else 0.05,
            f"Memory pressure: {why}",
            evidence,
            Advice("Use a batch that leaves headroom (measure the largest that fits with %autobatch), reach the batch "
                   "you want with gradient accumulation, and let the allocator grow segments instead of fragmenting.",
                   "import os\n"
                   "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'  # before CUDA starts"),
        )
    steady = s.steady_step_us  # as gpu_idle judges it
    if not s.has_device_events or steady <= 0:
        return None
    idle = max(steady - s.device_busy_us, 0.0) / steady
    if idle >= THRESHOLDS["batch_small_idle_share"] and most < THRESHOLDS["batch_small_peak_fraction"]:
        # (a 4096-wide MLP at batch 1024 on an H200 used 0.3%: "at most 0%" said nothing)
        in_use = "under 1%" if most < 0.01 else f"{most:.0%}" if most == least else f"at most {most:.0%}"
        return make_finding(
            "batch_size", ctx, idle * 0.5,
            f"Small batch: the GPU idles {idle:.0%} of the step with {in_use} of its memory in use",
            {"idle_share": round(idle, 3), **evidence},
            Advice("A bigger batch gives each kernel more work and the GPU less waiting; %autobatch --throughput "
                   "finds the largest that fits and where samples/s stop growing (the knee).",
                   "def step(batch_size):\n    x = make_batch(batch_size)   # your batch\n    train_step(x)"),
        )
    return None
