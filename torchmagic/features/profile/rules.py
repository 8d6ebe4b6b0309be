"""Diagnosis rules: small pure functions from a :class:`TraceSummary` to findings.

Every threshold lives in :data:`THRESHOLDS`.  A rule returns ``None`` or one
:class:`~torchmagic.features.profile.result.Finding`.  Rules read only the summary and a
:class:`RuleContext` (what the device can do), so they are tested on real CPU profiles
and on summaries built from numbers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from ...core.expectations import Expectation, measured
from ...core.render.format import fmt_us
from .amp_estimate import AmpEstimate
from .result import Finding
from .libraries import library_call, library_fix, possessive
from .regions import EVALUATION, parts
from .summary import TraceSummary
from .traffic import TENSOR_CORE_MULTIPLE
from .user import UserObjects

THRESHOLDS = {
    # dataloader: exposed DataLoader __next__ time, as a share of the step (TensorBoard plugin's 5%)
    "dataloader_share": 0.05,
    # sync: host reads of device values per step worth batching; blocking share that is always worth it
    "sync_calls_per_step": 3,
    "sync_block_share": 0.05,
    # dispatch_bound: many ops straight from Python, each short
    "dispatch_ops_per_step": 100,
    "dispatch_median_op_us": 20.0,
    "dispatch_small_op_share": 0.3,   # share of the step spent in those short ops plus Python between them
    # amp: share of op time in fp32 matmul/conv on hardware with fast 16-bit floats
    "amp_fp32_matmul_share": 0.25,
    # ... and only when the matmuls are not tiny: below this mean time per fp32 matmul call (its kernels'
    # time on a GPU, where the host only launches them; its host time on CPU), the casts autocast adds
    # cost more than 16-bit kernels save (an 8x32 @ 32x32 matmul ran 15x slower in bf16 on CPU)
    "amp_min_matmul_us": 20.0,
    "amp_min_speedup": 1.05,        # the amp finding is raised where even the pessimistic prediction beats this
    # copies: copy/conversion share of the step
    "copies_share": 0.10,
    "pageable_h2d_per_step": 1,
    "pageable_h2d_share": 0.05,   # ... and only where those copies take this share of the step on the GPU
    # inference_grad: autograd graph nodes built per step with no backward (grad mode with nothing
    # requiring grad records ops under one sequence number: that counts as one, not a graph)
    "inference_grad_nodes_per_step": 2,
    # ... and, beside a backward, at least this share of the nodes it used: a forward pass, not a stray op
    "inference_grad_unused_share": 0.25,
    # optimizer: optimizer share of the step without foreach/fused kernels
    "optimizer_share": 0.10,
    "optimizer_ops_per_step": 8,
    # gpu_idle: share of the step the device sits idle
    "gpu_idle_share": 0.30,
    # batch_size: memory pressure (allocator retries, or the step's peak allocation this close to the
    # device's size: allocated, not reserved, so below 1 by the allocator's cache and the CUDA context),
    # or a small batch: the device mostly idle with most of its memory unused
    "batch_pressure_peak_fraction": 0.90,
    "batch_small_idle_share": 0.50,
    "batch_small_peak_fraction": 0.25,
    # tensor_core_alignment: 16-bit matmuls with a dimension not a multiple of 8, as a share of all kernel time
    "misaligned_matmul_share": 0.10,
    # kernel statistics: a kernel this short is mostly launch overhead
    "short_kernel_us": 10.0,
    # severity from the share of the step a finding could win back
    "severity_high": 0.25,
    "severity_medium": 0.10,
}

# The torchmagic command that measures each rule's fix; {loader} is the code's DataLoader as it names
# it ("loader" where it names none), {step} a step function for %autobatch.  A cell magic's command
# goes on top of the profiled cell.
VERIFY_NAMES = {"loader": "loader", "step": "step"}
EXPECTING_MAGICS = frozenset({"amp_compare", "loadertune"})  # verify magics that judge an --expect range
VERIFY = {
    "dataloader": "%loadertune {loader}",
    "batch_size": "%autobatch --throughput {step}",
    "amp": "%%amp_compare --variants eager,amp",
    "dispatch_bound": "%%amp_compare --variants eager,compile",
    "inference_grad": "%%amp_compare --variants eager,inference_mode",
    "sync": "%%torchprofile --warmup 1 --steps 5",
    "copies": "%%torchprofile --warmup 1 --steps 5",
    "optimizer": "%%torchprofile --warmup 1 --steps 5",
    "gpu_idle": "%%torchprofile --warmup 1 --steps 5",
    "tensor_core_alignment": "%%torchprofile --warmup 1 --steps 5",
}


@dataclass(frozen=True)
class AllocatorCounters:
    """The GPU caching allocator's counters (bytes) before the cell's first run and after the profile."""

    total: int                 # the device's size
    allocated_before: int
    allocated_after: int
    peak_before: int           # the high-water mark, which torchmagic never resets (it is the user's)
    peak_after: int
    device: str = "cuda:0"     # which GPU: the trace's memory events are read for this one only


@dataclass(frozen=True)
class RuleContext:
    device_type: str                 # "cpu", "cuda", "mps": as the fixes' code names it (torch.autocast)
    low_precision_fast: bool         # the device has fast bf16/fp16 matmuls
    low_precision_dtype: str | None  # "bfloat16" / "float16"
    low_precision_reason: str
    accelerator: bool = False        # a GPU: the host hands it work (on CPU the host does the work)
    traces_kernels: bool = False     # ops run as kernels the trace records: the GPU rules need those
    captures_cuda_graphs: bool = False
    autocast_keeps: str = "losses in fp32"  # what autocast leaves in fp32 on this device
    user: UserObjects = UserObjects()        # the code's model, optimizer and loader, the machine's cores
    alloc_retries: int = 0                   # allocator cache flushes during the profile (CUDA)
    allocator: AllocatorCounters | None = None  # for the profiled steps' peak (CUDA)
    # a live profile's measurements on this device (features/profile/amp_estimate.py); None for a trace
    amp_estimate: AmpEstimate | None = None
    code: str | None = None                  # expectations.code_key of the profiled code: what verify commands
                                             # measured for it (expectations.measured) stands over a prediction


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


def severity(share: float) -> str:
    if share >= THRESHOLDS["severity_high"]:
        return "high"
    if share >= THRESHOLDS["severity_medium"]:
        return "medium"
    return "low"


def _finding(rule: str, ctx: RuleContext, share: float, title: str, evidence: dict,
             fix: str, snippet: str, expected: Expectation | None = None) -> Finding:
    command = VERIFY.get(rule)
    magic = command.lstrip("%").split()[0] if command else None
    verify = command.format(**{**VERIFY_NAMES, "loader": ctx.user.loader}) if command else None
    if verify is not None and expected is not None and magic in EXPECTING_MAGICS:
        verify += f" {expected.option()}"
    return Finding(rule=rule, severity=severity(share), title=title, evidence=evidence,
                   fix=fix, snippet=snippet, verify=verify, share=round(share, 4), expected=expected)


def _per_step(count: float) -> str:
    """A count per step as it is: 4, or 3.5 where the steps differ (whole from 100 on: 1922)."""
    return f"{count:.0f}" if count >= 100 else f"{count:.1f}".removesuffix(".0")


def _share(part_us: float, s: TraceSummary) -> float:
    """A share of the steady state: the steps' time less one-time costs (the CUDA context ...)."""
    steady = s.steady_step_us
    return part_us / steady if steady > 0 else 0.0


def dataloader(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    # On a GPU only the loading time the device sits idle through is exposed; on CPU all of it is.
    exposed = s.data_exposed_us if s.data_exposed_us is not None else s.data_us
    share = _share(exposed, s)
    if share <= THRESHOLDS["dataloader_share"]:
        return None
    workers, needed, threads = loader_workers(s, ctx, exposed)
    u = ctx.user
    split = cpu_core_split(s, ctx, exposed)
    evidence = {"exposed_ms_per_step": round(exposed / s.steps / 1e3, 3),
                "loading_ms_per_step": round(s.data_us / s.steps / 1e3, 3), "share_of_step": round(share, 4),
                "workers_now": u.loader_workers, "workers_needed": needed, "cores": u.cores}
    if split is not None:
        return _loading_on_own_cores(ctx, share, evidence, exposed / s.steps, split)
    fix = ("Load batches in background worker processes so the next batch is ready when the step needs it; "
           "keep workers alive between epochs; pin memory for fast, asynchronous copies to a GPU. ")
    plural = "s" if workers != 1 else ""
    if needed <= workers:
        fix += f"{workers} worker{plural} would keep up with this step"
        fix += " (from the trace's times: check the cores of the machine it will run on)." if u.cores is None else "."
    elif (u.loader_workers or 0) >= workers:
        fix += (f"It has {u.loader_workers} worker{'s' if u.loader_workers != 1 else ''} already, no fewer than this "
                f"machine's {u.cores} cores, and would need about {needed}: make each batch cheaper to load, or the "
                "step longer with a larger batch (more workers than cores help only while loading waits on a disk "
                "or the network, not while it computes).")
    else:
        fix += (f"It would need about {needed} workers to keep up; {workers}, one per core of this machine's "
                f"{u.cores}, is the most that helps a loader that computes: also make each batch cheaper to load.")
    if threads is not None and split is None:
        fix += (f" On a CPU-only machine the workers compete with torch's own threads for the {u.cores} cores: "
                f"leave them cores with torch.set_num_threads({threads}), and measure.")
    indent = " " * (len(u.loader) + 14)
    snippet = (f"{u.loader} = DataLoader({u.loader}.dataset, {_batching(u)},\n"
               f"{indent}collate_fn={u.loader}.collate_fn, worker_init_fn={u.loader}.worker_init_fn,\n"
               f"{indent}multiprocessing_context={u.loader}.multiprocessing_context, num_workers={workers},\n"
               f"{indent}persistent_workers=True, prefetch_factor=2,\n"
               f"{indent}pin_memory=torch.cuda.is_available())")
    if threads is not None:
        snippet += f"\ntorch.set_num_threads({threads})   # the cores the workers leave"
    return _finding(
        "dataloader", ctx, share,
        f"Input pipeline: {share:.0%} of the step waits on the DataLoader",
        evidence, fix, snippet,
    )


def _batching(u: UserObjects) -> str:
    """The arguments that keep a rebuilt DataLoader's batches as the user's loader makes them."""
    if u.loader_iterable:  # an IterableDataset batches itself: no sampler to pass on
        return f"batch_size={u.loader}.batch_size, drop_last={u.loader}.drop_last"
    if u.loader_batch_size is not None or "loader" not in u.found:
        return f"batch_size={u.loader}.batch_size, sampler={u.loader}.sampler, drop_last={u.loader}.drop_last"
    return f"batch_sampler={u.loader}.batch_sampler"  # it decides the batches (and whether the last is dropped)


def cpu_core_split(s: TraceSummary, ctx: RuleContext, exposed_us: float) -> tuple[int, int, float, float] | None:
    """On a CPU-only machine, how to share its cores between loader workers and torch's threads:
    (workers, threads, predicted µs per step, µs per step now), workers 0 where no split beats loading
    in the step.  None off CPU-only machines, for a trace from elsewhere, or a loader with workers.

    Loading that computes takes L a batch on one core; the rest of the step takes C on the T threads
    torch has, C·T of core time if its ops scale with threads (the worst case for workers).  With w
    workers and t = cores - w threads (at least 1), a batch is ready every L/w, the rest takes
    C·T/min(t, T), and all of it needs L + C·T of core time from the machine's cores: the step takes
    the longest of the three, against L + C now.  On 2 cores with T = 2 that helps only when loading
    dominates: a worker costs the step its threads."""
    u = ctx.user
    if ctx.accelerator or not u.cores or not u.threads or u.loader_workers:
        return None
    loading = exposed_us / s.steps
    rest = max(s.total_step_us / s.steps - loading, 0.0)
    now = loading + rest
    best = (0, u.threads, now)
    for w in range(1, u.cores + 1):
        t = max(u.cores - w, 1)
        predicted = max(loading / w, rest * u.threads / min(t, u.threads), (loading + rest * u.threads) / u.cores)
        if predicted < min(best[2], now * 0.95):  # a predicted gain under 5% is within what the model can tell
            best = (w, t, predicted)
    return best[0], best[1], best[2], now


def _loading_on_own_cores(ctx: RuleContext, share: float, evidence: dict, loading_us: float,
                          split: tuple[int, int, float, float]) -> Finding:
    """The dataloader finding on a CPU-only machine whose loader loads in the training process.

    Whether workers help there is not in the trace: loading that waits (a disk, the network) or releases
    the GIL runs beside the step on a worker, loading that computes takes the cores the step's threads
    use, and other processes on the machine take their share.  So the finding predicts no figure: it gives
    both cases, and what %loadertune measured on this loader, once it has (core/expectations.py)."""
    u = ctx.user
    workers, threads, pessimistic_us, now_us = split
    rest_us = now_us - loading_us
    verdict = measured("dataloader", f"loader:{u.loader}")
    evidence.update(rest_ms_per_step=round(rest_us / 1e3, 3), computing_bound_ms_per_step=round(pessimistic_us / 1e3, 3))
    workers = max(workers, 1)
    threads = max(u.cores - workers, 1)
    best = now_us / max(rest_us, loading_us / workers, 1e-9)
    measures = (f"Loading takes {fmt_us(loading_us)} a step, the rest of the step {fmt_us(rest_us)} on {u.threads} "
                f"thread{'s' if u.threads != 1 else ''}, on a CPU-only machine of {u.cores} "
                f"core{'s' if u.cores != 1 else ''}. ")
    cheaper = ("Loading that computes gets cheaper batched (transforms as tensor ops on the whole batch in a "
               "collate_fn) or done once before training.")
    if verdict is None:
        fix = (measures + f"If the loading waits (a disk, the network) or releases the GIL, {workers} "
               f"worker{'s' if workers != 1 else ''}, with torch.set_num_threads({threads}) leaving them the cores, would "
               f"hide it: the step up to {best:.2f}x faster. If it computes "
               "(decoding, per-item transforms in Python), workers take the cores the step's own threads use"
               + (f" and the step gains little (at best {now_us / pessimistic_us:.2f}x)" if pessimistic_us < now_us
                  else " and the step would not get faster")
               + ", less where other processes keep the machine busy. The trace cannot tell which: measure the "
               "loader with workers (the verify command), then profile again. " + cheaper)
    else:
        low, high = verdict.ci
        evidence["loadertune_measured"] = [round(verdict.speedup, 3), round(low, 3), round(high, 3)]
        fix = (f"%loadertune measured its best setting at {verdict.speedup:.2f}x the batches/s of {u.loader} as it "
               f"is (95% CI {low:.2f}-{high:.2f}x): "
               + ("workers hide this loading here; set them as below and profile again. " if low > 1.0 else
                  "workers do not make this loader faster here: the loading computes on the step's own cores. ")
               + measures + ("" if low > 1.0 else cheaper))
    indent = " " * (len(u.loader) + 14)
    snippet = (f"{u.loader} = DataLoader({u.loader}.dataset, {_batching(u)},\n"
               f"{indent}collate_fn={u.loader}.collate_fn, worker_init_fn={u.loader}.worker_init_fn,\n"
               f"{indent}multiprocessing_context={u.loader}.multiprocessing_context, num_workers={workers},\n"
               f"{indent}persistent_workers=True)   # set it False if the loop breaks out early: each new\n"
               f"{indent}# iter() would first drain the batches the workers prefetched\n"
               f"torch.set_num_threads({threads})   # the cores the workers leave")
    title = f"Input pipeline: {share:.0%} of the step waits on the DataLoader, loading on the step's own cores"
    return _finding("dataloader", ctx, share, title, evidence, fix, snippet)


def loader_workers(s: TraceSummary, ctx: RuleContext, exposed_us: float) -> tuple[int, int, int | None]:
    """(workers to use, workers the step needs, torch threads to leave them or None).

    A step spends ``rest`` on its own work and waits ``exposed`` for its batch.  With no workers the
    batch takes ``exposed`` to load, and k workers, loading one batch each in parallel, keep up when
    k ≥ exposed / rest; with w workers already, each takes w·(rest + exposed) per batch, so it takes
    w·(rest + exposed) / rest.  No more workers than usable cores (the verify command sweeps up to
    there) unless it has more already, and torch keeps at least one thread."""
    rest = max(s.total_step_us - exposed_us, 1e-3 * s.total_step_us) / s.steps
    exposed = exposed_us / s.steps
    now = ctx.user.loader_workers or 0
    needed = math.ceil(now * (rest + exposed) / rest if now else exposed / rest)
    needed = max(needed, now + 1, 1)
    cores = ctx.user.cores
    workers = min(needed, max(cores, now)) if cores else needed  # never fewer than it has
    threads = max(cores - workers, 1) if cores and not ctx.accelerator else None
    return workers, needed, threads


def sync(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    per_step = (s.sync_calls + s.device_read_calls) / s.steps
    blocking_us = s.sync_us + s.sync_runtime_us + s.device_read_us
    share = _share(blocking_us, s)
    if per_step < THRESHOLDS["sync_calls_per_step"] and share < THRESHOLDS["sync_block_share"]:
        return None
    expected = Expectation.removing(share, "the time the host blocks on them")
    if not ctx.accelerator:
        title = (f"{_per_step(per_step)} host reads of tensor values per step (.item(), .tolist(), nonzero): "
                 "free on CPU, a full pipeline stall each on a GPU")
        share = min(share, THRESHOLDS["severity_medium"] - 1e-9)  # cheap here: never above 'low'
    elif round(share, 2) == 0:
        title = (f"{_per_step(per_step)} host-device syncs per step, each a stall of the device's queue (the host "
                 "waited little for them: the device had finished)")
    else:
        title = f"{_per_step(per_step)} host-device syncs per step block the CPU for {share:.0%} of the step"
        if s.device_read_calls:
            title += f" ({_per_step(s.device_read_calls / s.steps)} of them copies to the host: .cpu(), .tolist(), print)"
        starved = gpu_waiting_share(s, ctx)
        if starved is not None and starved < share:
            # a host blocked on a busy GPU costs the step only the time the GPU then waits for new launches
            title += f"; the GPU waits on the host {starved:.0%} of the step"
            share = starved
            expected = Expectation.removing(share, "the time the GPU waits on the host")
    evidence = {"syncs_per_step": round(per_step, 2), "blocking_ms_per_step": round(blocking_us / s.steps / 1e3, 3),
                "share_of_step": round(share, 4), "sync_runtime_calls": s.sync_runtime_calls,
                "device_to_host_copies_per_step": round(s.device_read_calls / s.steps, 2)}
    inside = library_call(s.syncs_in_library, s.sync_calls)
    if inside is not None:
        package, function = inside
        fix, snippet = library_fix(package, function, ctx.user.model)
        evidence["inside"] = f"{package}.{function}"
        return _finding("sync", ctx, share, f"{title}; {_per_step(s.syncs_in_library.most_common(1)[0][1] / s.steps)} of "
                        f"them inside {possessive(package)} {function}", evidence, fix, snippet, expected)
    split = parts(s)
    if split is not None and split[EVALUATION].sync_calls:
        by_part = {name: round(part.sync_calls / s.steps, 2) for name, part in split.items()}
        evidence["syncs_per_step_by_part"] = by_part
        title += " ({} in the training part, {} in the evaluation part)".format(*map(_per_step, by_part.values()))
        if split[EVALUATION].sync_calls * 2 >= s.sync_calls:
            model, loader = ctx.user.model, ctx.user.loader
            return _finding(
                "sync", ctx, share, title, evidence,
                "Most of them are in the evaluation part: accumulate its metrics on the device and read the "
                "totals once, after the evaluation loop.",
                "correct = torch.zeros((), dtype=torch.long, device=device)\n"
                f"{model}.eval()\n"
                "with torch.inference_mode():\n"
                f"    for x, y in {loader}:   # the evaluation's loader\n"
                f"        correct += ({model}(x).argmax(1) == y).sum()   # no sync\n"
                f"accuracy = correct.item() / len({loader}.dataset)   # one sync\n"
                f"{model}.train()", expected,
            )
    return _finding(
        "sync", ctx, share, title, evidence,
        "Keep running values on the device and read them once per step (or every N steps); "
        "avoid .item()/.tolist()/print(tensor) and data-dependent shapes (nonzero, masked_select) inside the loop.",
        "running_loss = torch.zeros((), device=device)\n"
        f"for step, (x, y) in enumerate({ctx.user.loader}):\n"
        "    loss = train_step(x, y)\n"
        "    running_loss += loss.detach()          # no sync\n"
        "    if step % 50 == 0:\n"
        "        print(running_loss.item() / 50)    # one sync every 50 steps\n"
        "        running_loss.zero_()", expected,
    )


def dispatch_bound(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """Many short ops from Python, judged per part of the step where it trains and evaluates (regions.py):
    an evaluation pass of tiny ops is not hidden by the big matmuls of the training beside it, and the
    other way round: a part is judged on its own time, its severity on the step's.  Where both parts are
    overhead-bound, or neither, or the step is one part, the step is judged."""
    bound = [(p, judged) for p in (parts(s) or {}).values() if (judged := _overhead(p.op_us, p.gap_us, s, p.time_us))]
    part, judged = bound[0] if len(bound) == 1 else (None, _overhead(s.python_op_us, s.category_us["other"], s))
    if judged is None:
        return None
    per_step, median, share = judged
    if ctx.accelerator and not s.has_device_events:
        return None  # the host's overhead matters where the device waits for it: without its work, no telling
    starved = gpu_waiting_share(s, ctx)
    if starved is not None:
        # On a GPU the host's overhead costs only the time the GPU waits for it: none while kernels queue
        if starved < THRESHOLDS["dispatch_small_op_share"]:
            return None
        share = min(share, starved)
    target = "CUDA graphs (mode='reduce-overhead')" if ctx.captures_cuda_graphs else "fused kernels"
    where = f" {part.name} part" if part is not None else ""
    title = f"Overhead-bound{where}: {_per_step(per_step)} ops per step from Python, median {median:.1f} µs each"
    evidence = {"ops_per_step": round(per_step, 1), "median_op_us": round(median, 2),
                "python_and_small_op_share": round(share, 4)}
    if starved is not None:
        evidence["gpu_waiting_share"] = round(starved, 4)
        title += f"; the GPU waits for them {starved:.0%} of the step"
    if part is not None:
        evidence["part"] = part.name
        evidence["part_share_of_step"] = round(_share(part.time_us, s), 4)
    inside = library_call(s.python_ops_in_library, s.python_ops)
    if inside is not None:
        package, function = inside
        fix, snippet = library_fix(package, function, ctx.user.model)
        evidence["inside"] = f"{package}.{function}"
        return _finding("dispatch_bound", ctx, share, f"{title}, most inside {possessive(package)} {function}",
                        evidence, fix, snippet)
    # Whether compiling pays is not in the trace: a compiled call has its own fixed cost (guards, a wrapper
    # and, with autograd on, an autograd function around the graph), which on the tour's 200 one-item calls
    # made it 0.47x on an AMX Xeon.  So no figure is predicted until %%amp_compare has measured it.
    fix = (f"Each op pays Python and dispatcher overhead; the work per op is too small to hide it. "
           "Give each op more work (batch the items a loop handles one at a time, larger batches, vectorise Python "
           f"loops over tensors), or compile the step so many small ops become {target}. A compiled call has its "
           "own fixed cost (guards, a wrapper; with autograd on, an autograd function around the graph): whether "
           "compiling pays here is not in the trace, so the verify command measures it.")
    snippet = f"{ctx.user.model} = torch.compile({ctx.user.model})  # pays off after the compile cost is amortised; measure it"
    verdict = measured("dispatch_bound", ctx.code)  # what %%amp_compare measured torch.compile at on this code
    if verdict is not None:
        low, high = verdict.ci
        evidence["compile_measured"] = [round(verdict.speedup, 3), round(low, 3), round(high, 3)]
        if low <= 1.0:  # compiling did not pay here: the other fix
            fix = (f"Each op pays Python and dispatcher overhead; the work per op is too small to hide it. "
                   f"torch.compile measured {verdict.speedup:.2f}x on this code (95% CI {low:.2f}-{high:.2f}x, "
                   "%%amp_compare): give each op more work instead: batch the requests or items a loop handles one "
                   "at a time, and vectorise Python loops over tensors.")
            snippet = ""  # how to batch depends on the loop, which the trace does not show: no code to guess
        else:
            fix = (f"Each op pays Python and dispatcher overhead; the work per op is too small to hide it. Compile the "
                   f"step so many small ops become {target}: torch.compile measured {verdict.speedup:.2f}x on this code "
                   f"(95% CI {low:.2f}-{high:.2f}x, %%amp_compare).")
            expected = Expectation(round(low, 2), round(high, 2), "%%amp_compare measured it on this code")
            return _finding("dispatch_bound", ctx, share, title, evidence, fix, snippet, expected)
    return _finding("dispatch_bound", ctx, share, title, evidence, fix, snippet)


def gpu_waiting_share(s: TraceSummary, ctx: RuleContext) -> float | None:
    """On a GPU trace, the share of the step the GPU sits idle for want of launches: idle time less the
    loading it idles through (the dataloader rule's); None where the trace has no kernels to tell by."""
    steady = s.steady_step_us
    if not ctx.traces_kernels or not s.has_device_events or steady <= 0:
        return None
    idle = max(steady - s.device_busy_us - (s.data_exposed_us or 0.0), 0.0)
    return idle / steady


def _overhead(op_us: list[float], python_us: float, s: TraceSummary,
              part_us: float | None = None) -> tuple[float, float, float] | None:
    """(ops per step, median op µs, share of the step in short ops and the Python between them) for ops
    called from Python, when they are many, short, and take enough of their part of the step (all of it
    unless ``part_us``) to be worth compiling."""
    per_step = len(op_us) / s.steps
    if not op_us or per_step < THRESHOLDS["dispatch_ops_per_step"]:
        return None
    median = statistics.median(op_us)
    if median > THRESHOLDS["dispatch_median_op_us"]:
        return None
    overhead = sum(d for d in op_us if d <= THRESHOLDS["dispatch_median_op_us"]) + python_us
    part_us = s.steady_step_us if part_us is None else part_us
    if part_us <= 0 or overhead / part_us < THRESHOLDS["dispatch_small_op_share"]:
        return None
    return per_step, median, _share(overhead, s)


def amp(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    if not ctx.low_precision_fast:
        return None  # no 16-bit matmul instructions (an AVX2-only CPU, a pre-Volta GPU): never faster
    if ctx.traces_kernels and not s.has_device_events:
        return None  # such an op's host time is its launch: without kernel times there is nothing to judge
    # on a GPU, by kernel time: share of all kernel time, and time per call (the host only launches)
    on_device = s.has_device_events
    fp32 = s.matmul_fp32_device_us if on_device else s.matmul_fp32_us
    calls = s.matmul_fp32_device_calls if on_device else s.matmul_fp32_calls
    share = fp32_matmul_share(s)
    if share < THRESHOLDS["amp_fp32_matmul_share"]:
        return None
    expected, claim = _amp_expected(ctx)
    if expected is None and (ctx.amp_estimate is not None or measured("amp", ctx.code) is not None):
        return None  # predicted, or measured, to bring too little here
    if expected is None and calls and fp32 / calls < THRESHOLDS["amp_min_matmul_us"]:
        return None
    dtype = ctx.low_precision_dtype or "bfloat16"
    device = ctx.device_type
    model, opt = ctx.user.model, ctx.user.optimizer
    training = s.backward_events > 0
    fp16_training = training and dtype == "float16"
    if fp16_training:
        snippet = (f"scaler = torch.amp.GradScaler('{device}')   # once, before the loop\n"
                   f"with torch.autocast('{device}', dtype=torch.float16):\n    loss = loss_fn({model}(x), y)\n"
                   f"scaler.scale(loss).backward()\nscaler.step({opt})\nscaler.update()")
    elif training:
        snippet = (f"with torch.autocast('{device}', dtype=torch.{dtype}):\n    loss = loss_fn({model}(x), y)\n"
                   "loss.backward()   # outside autocast")
    else:
        snippet = f"with torch.inference_mode(), torch.autocast('{device}', dtype=torch.{dtype}):\n    out = {model}(x)"
    fix = f"Run the forward pass under autocast: matmuls and convolutions in {dtype}; {ctx.autocast_keeps}. "
    if dtype == "bfloat16":
        fix += "bfloat16 keeps fp32's range, so no loss scaling is needed. "
    else:
        fix += (f"fp16 is the fast type here ({ctx.low_precision_reason}): "
                + ("scale the loss with a GradScaler so small fp16 gradients do not flush to zero. "
                   if training else "it suits inference as is. "))
    per_call = fp32 / calls if calls else None
    evidence = {"fp32_matmul_share": round(share, 4), "fp32_matmul_ms": round(fp32 / 1e3, 3),
                "fp32_matmul_us_per_call": round(per_call, 1) if per_call is not None else None,
                "low_precision_matmul_ms": round((s.matmul_low_device_us if on_device else s.matmul_low_us) / 1e3, 3),
                "why": ctx.low_precision_reason}
    if ctx.amp_estimate is not None:
        e = ctx.amp_estimate
        evidence.update(matmul_ratio_measured=round(e.matmul_ratio, 3), pointwise_ratio_measured=round(e.pointwise_ratio, 3),
                        calls_retimed=e.calls_timed, calls=e.calls)
    if expected is not None:
        evidence.update(predicted_speedup=[expected.low, expected.high], predicted_from=expected.basis)
    return _finding(
        "amp", ctx, share,
        f"{share:.0%} of the {'GPU kernel' if on_device else 'step'} time is fp32 matmul/conv; {claim}",
        evidence, fix + "Check the accuracy of the result against fp32 (%%amp_compare does).", snippet,
        expected=expected)


def fp32_matmul_share(s: TraceSummary) -> float:
    """The fp32 matmuls' and convolutions' share: of the GPU's kernel time where the trace has kernels, else
    of the steps."""
    fp32 = s.matmul_fp32_device_us if s.has_device_events else s.matmul_fp32_us
    basis = sum(s.device_category_us.values()) if s.has_device_events else s.total_step_us
    return fp32 / basis if basis > 0 else 0.0


def amp_worth_estimating(s: TraceSummary) -> bool:
    return fp32_matmul_share(s) >= THRESHOLDS["amp_fp32_matmul_share"]


def _amp_expected(ctx: RuleContext) -> tuple[Expectation | None, str]:
    """The amp fix's predicted step speedup and the title's claim: from what %%amp_compare measured on this
    code where it has, else re-timed here (amp_estimate.py), else (a trace from elsewhere) the device's
    known capability alone, with no figure.  None where what is known says it would bring too little."""
    dtype = ctx.low_precision_dtype or "bfloat16"
    verdict = measured("amp", ctx.code)
    if verdict is not None:
        low, high = verdict.ci
        if low < THRESHOLDS["amp_min_speedup"]:
            return None, ""
        return (Expectation(round(low, 2), round(high, 2), "%%amp_compare measured it on this code"),
                f"%%amp_compare measured autocast {verdict.speedup:.2f}x on this code")
    e = ctx.amp_estimate
    if e is not None:
        if e.expectation.low < THRESHOLDS["amp_min_speedup"]:
            return None, ""
        return e.expectation, f"{dtype} autocast predicted {e.expectation.text()} faster here"
    return None, f"this device runs {dtype} faster"


def copies(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """Copies and conversions on the host, or pageable host-to-device copies on the GPU, each judged on
    its own time: a pageable copy that takes no time is not worth pinning memory for."""
    share = _share(s.copy_us, s)
    pageable = s.pageable_h2d / s.steps
    pageable_share = _share(s.pageable_h2d_us, s)
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
    pinned = (f"{_per_step(pageable)} host-to-device cop{'y' if pageable == 1 else 'ies'} per step from pageable "
              f"memory take {pageable_share:.0%} of the step on the GPU")
    if share >= THRESHOLDS["copies_share"]:
        title = f"Copies and conversions take {host_share:.0%} of the step"
        if share < host_share:
            title += f" on the host; the GPU waits on the host {share:.0%}"
        title += f"; {pinned}" if pinning_pays else ""
    else:
        title = pinned[0].upper() + pinned[1:]
    removed = max(share, pageable_share if pinning_pays else 0.0)
    return _finding(
        "copies", ctx, removed, title,
        {"copies_ms_per_step": round(s.copy_us / s.steps / 1e3, 3), "share_of_step": round(share, 4),
         "pageable_h2d_per_step": round(pageable, 2),
         "pageable_h2d_ms_per_step": round(s.pageable_h2d_us / s.steps / 1e3, 3), "contiguous_calls": s.layout_copies},
        "; ".join(parts) + ".",
        f"{ctx.user.loader} = DataLoader({ctx.user.loader}.dataset, batch_size={ctx.user.loader}.batch_size, "
        "pin_memory=True)\n"
        "x = x.to(device, non_blocking=True)\n"
        f"{ctx.user.model} = {ctx.user.model}.to(memory_format=torch.channels_last)   # conv nets",
        Expectation.removing(removed, "the copies' time" if starved is None else "the time the GPU waits on them"),
    )


def inference_grad(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """Forward passes whose graph no backward uses: inference with autograd on, or, in a cell that
    also trains, its evaluation part (a graph node is a forward op's sequence number; each backward
    function carries the number of the node it differentiates)."""
    unused = s.graph_nodes - s.backward_nodes
    per_step = len(unused) / s.steps
    used = len(s.graph_nodes & s.backward_nodes) / s.steps
    if per_step < THRESHOLDS["inference_grad_nodes_per_step"]:
        return None
    if per_step < THRESHOLDS["inference_grad_unused_share"] * used:
        return None  # a stray node or two beside training (a running total kept with grad): not a forward pass
    unused_us = sum(s.graph_node_us.get(node, 0.0) for node in unused)
    share = 0.1 * _share(unused_us or s.category_us["forward"], s)  # what autograd's bookkeeping costs
    model = ctx.user.model
    if s.backward_events:  # the cell also trains: this is its evaluation
        title = (f"Evaluation with autograd on: {_per_step(per_step)} graph nodes per step come from a forward pass "
                 f"no backward uses ({_share(unused_us, s):.0%} of the step)")
        fix = ("Run the evaluation part under torch.inference_mode() (torch.no_grad() if its outputs go back "
               "into training), with the model in eval mode: no graph, no saved activations.")
        snippet = f"{model}.eval()\nwith torch.inference_mode():\n    out = {model}(x)   # the evaluation pass\n{model}.train()"
    else:
        title = f"Inference with autograd on: {_per_step(per_step)} graph nodes per step are recorded and no backward uses them"
        fix = "Run inference under torch.inference_mode(): no graph, no saved activations, less memory and time."
        snippet = f"with torch.inference_mode():\n    out = {model}(x)"
    # inference_mode only removes work, at most the ops that recorded the graph: a bound, not a figure
    building = _share(unused_us, s)
    expected = (Expectation.removing(building, "the ops that recorded the unused graph")
                if not s.backward_events and unused_us else None)
    return _finding(
        "inference_grad", ctx, share, title,
        {"unused_graph_nodes_per_step": round(per_step, 1), "used_graph_nodes_per_step": round(used, 1),
         "unused_ms_per_step": round(unused_us / s.steps / 1e3, 3), "backward_ops": s.backward_events},
        fix, snippet, expected=expected,
    )


FUSED_ON_CPU = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})  # torch's optimizers with a fused CPU kernel


def optimizer(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """A per-parameter update loop.  On a GPU the multi-tensor (foreach) implementation is one kernel per
    op over all parameters; on the CPU its ops still loop over the tensors (AdamW's step: 2.6 ms against
    2.9 ms), and only the fused kernel is one pass (0.8 ms), so there foreach is no fix."""
    share = _share(s.optimizer_us, s)
    ops_per_step = s.optimizer_ops / s.steps
    on_cpu = not ctx.accelerator
    vectorised = s.optimizer_fused or (s.optimizer_foreach and not on_cpu)
    if share < THRESHOLDS["optimizer_share"] or vectorised or ops_per_step < THRESHOLDS["optimizer_ops_per_step"]:
        return None
    names = ", ".join(sorted(s.optimizer_names)) or "the optimizer"
    name = sorted(s.optimizer_names)[0] if s.optimizer_names else "AdamW"
    opt = ctx.user.optimizer
    switch = ("The optimizer reads the switch from its parameter groups at each step, so it can be set on the one "
              "you have (its state and hyperparameters stay)")
    if on_cpu and name in FUSED_ON_CPU:
        fix = (f"Use the fused implementation: one pass over all parameters instead of a Python loop of "
               f"per-parameter ops. On the CPU the multi-tensor (foreach) one still loops over the tensors and gains "
               f"little. {switch}; or build it with fused=True.")
        snippet = f"for group in {opt}.param_groups:\n    group['fused'] = True\n    group['foreach'] = False"
    elif on_cpu:
        if s.optimizer_foreach:
            return None  # foreach already, and no fused CPU kernel for it: nothing faster to offer
        fix = (f"Use the multi-tensor (foreach) implementation. On the CPU its ops still loop over the tensors, so "
               f"it gains little: {name} has no fused CPU kernel (Adam, AdamW, SGD and Adagrad have). {switch}.")
        snippet = f"for group in {opt}.param_groups:\n    group['foreach'] = True"
    else:
        fix = (f"Use the multi-tensor (foreach) or fused implementation: one kernel over all parameters instead of "
               f"a Python loop of per-parameter ops. {switch}; or build it with foreach=True, or fused=True where "
               f"{name} supports it.")
        snippet = f"for group in {opt}.param_groups:\n    group['foreach'] = True"
    return _finding(
        "optimizer", ctx, share,
        f"{names} takes {share:.0%} of the step, one small op per parameter ({_per_step(ops_per_step)} ops per step)",
        {"optimizer_ms_per_step": round(s.optimizer_us / s.steps / 1e3, 3), "share_of_step": round(share, 4),
         "ops_per_step": round(ops_per_step, 1)},
        fix, snippet, Expectation.removing(share, f"the optimizer's time (the {'fused' if on_cpu else 'new'} "
                                                  "update still updates)"),
    )


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
    return _finding(
        "gpu_idle", ctx, share,
        f"The GPU is idle {share:.0%} of the step{because}",
        {"idle_ms_per_step": round(idle / s.steps / 1e3, 3), "busy_ms_per_step":
         round(s.device_busy_us / s.steps / 1e3, 3), "kernels": s.device_kernels, "causes": causes,
         **{k: round(v, 3) for k, v in kernel_stats(s).items()}},
        "Keep the GPU fed: fix the causes listed, then batch more work per launch "
        "(larger batches, torch.compile, CUDA graphs).",
        f"{ctx.user.model} = torch.compile({ctx.user.model}, mode='reduce-overhead')  # CUDA graphs for static shapes",
        Expectation.removing(share, "the GPU's idle time"),
    )


def tensor_core_alignment(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """fp16/bf16 matmuls whose M, K or N is not a multiple of 8, and convolutions whose input or output
    channels are not: cuBLAS and cuDNN cannot run them on tensor cores at full rate (a 50257-token
    vocabulary, or an RGB image's 3 channels, are the classic cases)."""
    kernels = sum(s.kernel_us)
    if not ctx.traces_kernels or kernels <= 0:
        return None
    share = s.misaligned_matmul_device_us / kernels
    if share < THRESHOLDS["misaligned_matmul_share"]:
        return None
    shapes = [shape for shape, _ in s.misaligned_shapes.most_common(3)]
    return _finding(
        "tensor_core_alignment", ctx, _share(s.misaligned_matmul_device_us, s),
        f"{share:.0%} of the kernel time is 16-bit matmuls or convolutions with a dimension off the tensor "
        f"cores' grain ({'; '.join(shapes)}; M x K x N, or a convolution's channels in → out)",
        {"misaligned_share_of_kernels": round(share, 4), "misaligned_ms_per_step":
         round(s.misaligned_matmul_device_us / s.steps / 1e3, 3), "shapes": shapes},
        f"Pad the dimensions to multiples of {TENSOR_CORE_MULTIPLE} (64 for a vocabulary): hidden sizes, the "
        "output layer's rows, batch x sequence, a convolution's channels (an RGB input padded to 4 or 8 channels "
        "of zeros, in channels_last). cuBLAS and cuDNN then run them on tensor cores at full rate; the padding "
        "costs little and can be masked or sliced off.",
        "def padded(n, multiple=8):\n    return -(-n // multiple) * multiple\n"
        "head = torch.nn.Linear(padded(1000), padded(50257, 64))   # e.g. a language model's output layer",
        Expectation.removing(_share(s.misaligned_matmul_device_us, s), "the misaligned matmuls' kernel time"),
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
        return _finding(
            "batch_size", ctx, 0.10 if ctx.alloc_retries else 0.05,
            f"Memory pressure: {why}",
            evidence,
            "Use a batch that leaves headroom (measure the largest that fits with %autobatch), reach the batch you "
            "want with gradient accumulation, and let the allocator grow segments instead of fragmenting.",
            "import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'  # before CUDA starts",
        )
    steady = s.steady_step_us  # as gpu_idle judges it
    if not s.has_device_events or steady <= 0:
        return None
    idle = max(steady - s.device_busy_us, 0.0) / steady
    if idle >= THRESHOLDS["batch_small_idle_share"] and most < THRESHOLDS["batch_small_peak_fraction"]:
        # (a 4096-wide MLP at batch 1024 on an H200 used 0.3%: "at most 0%" said nothing)
        in_use = "under 1%" if most < 0.01 else f"{most:.0%}" if most == least else f"at most {most:.0%}"
        return _finding(
            "batch_size", ctx, idle * 0.5,
            f"Small batch: the GPU idles {idle:.0%} of the step with {in_use} of its memory in use",
            {"idle_share": round(idle, 3), **evidence},
            "A bigger batch gives each kernel more work and the GPU less waiting; %autobatch --throughput finds "
            "the largest that fits and where samples/s stop growing (the knee).",
            "def step(batch_size):\n    x = make_batch(batch_size)   # your batch\n    train_step(x)",
        )
    return None


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


RULES: tuple[Callable[[TraceSummary, RuleContext], Finding | None], ...] = (
    dataloader, sync, dispatch_bound, amp, copies, inference_grad, optimizer, batch_size, tensor_core_alignment,
)
SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


def diagnose(summary: TraceSummary, ctx: RuleContext) -> list[Finding]:
    """All findings for a profile, most costly first."""
    if summary.steps == 0 or summary.steady_step_us <= 0:
        return []
    found = [f for rule in RULES if (f := rule(summary, ctx)) is not None]
    idle = gpu_idle(summary, ctx, found)
    if idle is not None:
        found.append(idle)
    return sorted(found, key=lambda f: (SEVERITY_ORDER[f.severity], -f.share))
