"""Input pipeline: a step that waits on its DataLoader, and how many workers (and torch threads) fix it."""

from __future__ import annotations

import math

from ....core.expectations import measured
from ....core.render.format import fmt_us
from ..result import Finding
from ..summary import TraceSummary
from ..user import UserSetup
from .context import RuleContext
from .findings import THRESHOLDS, Advice, make_finding, share_of_step


def dataloader(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    # On a GPU only the loading time the device sits idle through is exposed; on CPU all of it is.
    exposed = s.data_exposed_us if s.data_exposed_us is not None else s.data_us
    share = share_of_step(exposed, s)
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
    return make_finding(
        "dataloader", ctx, share,
        f"Input pipeline: {share:.0%} of the step waits on the DataLoader",
        evidence, Advice(fix, snippet),
    )


def _batching(u: UserSetup) -> str:
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
    helps = verdict is None or verdict.ci[0] > 1.0  # the snippet does what the text says
    snippet = _workers_on_cores(u, workers, threads) if helps else _loaded_once(u, verdict.speedup)
    title = f"Input pipeline: {share:.0%} of the step waits on the DataLoader, loading on the step's own cores"
    return make_finding("dataloader", ctx, share, title, evidence, Advice(fix, snippet))


def _workers_on_cores(u: UserSetup, workers: int, threads: int) -> str:
    indent = " " * (len(u.loader) + 14)
    return (f"{u.loader} = DataLoader({u.loader}.dataset, {_batching(u)},\n"
            f"{indent}collate_fn={u.loader}.collate_fn, worker_init_fn={u.loader}.worker_init_fn,\n"
            f"{indent}multiprocessing_context={u.loader}.multiprocessing_context, num_workers={workers},\n"
            f"{indent}persistent_workers=True)   # set it False if the loop breaks out early: each new\n"
            f"{indent}# iter() would first drain the batches the workers prefetched\n"
            f"torch.set_num_threads({threads})   # the cores the workers leave")


def _loaded_once(u: UserSetup, speedup: float) -> str:
    """Where %loadertune measured workers no faster, the fix is cheaper loading, not workers: done once."""
    return (f"# %loadertune measured workers at {speedup:.2f}x here: keep num_workers={u.loader_workers or 0}, and do\n"
            "# the per-item work once, before training (where it is deterministic: random augmentation stays)\n"
            f"cached = [item for item in {u.loader}.dataset]\n"
            f"{u.loader} = DataLoader(cached, {_batching(u)},\n"
            f"{' ' * (len(u.loader) + 14)}collate_fn={u.loader}.collate_fn)")


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
