"""Cross-rank findings: a straggler and what it does longer, and communication the step pays for.

Each rule reads the per-rank summaries only, so it is tested on real traces and on numbers.
"""

from __future__ import annotations

import statistics

from ..result import Finding
from ..rules import severity
from .result import RankSummary

THRESHOLDS = {
    # exposed_comm: communication neither hidden under compute nor spent waiting, as a share of the step
    "exposed_transfer_share": 0.10,
}

_LOADER_SNIPPET = """\
sampler = DistributedSampler(dataset)          # each rank its own shard
loader = DataLoader(dataset, batch_size=..., sampler=sampler,
                    num_workers=..., persistent_workers=True)  # %loadertune loader: how many"""

_JOIN_SNIPPET = """\
from torch.distributed.algorithms.join import Join

with Join([model]):        # ranks that run out of batches early shadow the others' collectives
    for batch in loader:
        ...
# uneven work per step (sequence lengths): batch by length, or cap tokens per batch, per rank"""

# The fix for exposed communication depends on what communicates: DDP all-reduces gradients, FSDP
# all-gathers parameters and reduce-scatters gradients, pipeline stages and all-to-all send and receive.
_DDP = ("DDP's gradient all-reduce should run while backward computes the next gradients. Tune its buckets "
        "(bucket_cap_mb), keep gradients in them (gradient_as_bucket_view), declare a static graph, and with "
        "gradient accumulation all-reduce once per optimizer step (no_sync).", """\
model = DistributedDataParallel(
    model,
    bucket_cap_mb=...,               # larger: fewer all-reduces; smaller: the first starts sooner
    gradient_as_bucket_view=True,    # gradients live in the buckets: no copy in and out
    static_graph=True,               # the same parameters are used every step
)
with model.no_sync():                # gradient accumulation: all-reduce once per optimizer step
    loss.backward()""")
_FSDP = ("FSDP all-gathers each unit's parameters before it runs and reduce-scatters its gradients after: "
         "prefetch the next unit's all-gather so it runs under the current unit's compute, wrap in fewer, "
         "larger units (fewer collectives), and where memory allows keep parameters gathered between forward "
         "and backward.", """\
# FSDP2 (fully_shard)
for layer, following in zip(layers, layers[1:]):
    layer.set_modules_to_forward_prefetch([following])
for layer, preceding in zip(layers[1:], layers):
    layer.set_modules_to_backward_prefetch([preceding])
fully_shard(model, reshard_after_forward=False)   # no all-gather again in backward, if memory allows
# FSDP1: FSDP(model, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True,
#             limit_all_gathers=True, auto_wrap_policy=...)   # larger units: fewer collectives""")
_POINT_TO_POINT = ("Point-to-point transfers (pipeline stages, or all-to-all for experts and sharded embeddings): "
                   "a stage that waits for its neighbour's activations is the pipeline's bubble. Use more "
                   "micro-batches than stages and an interleaved schedule, and overlap the sends and receives "
                   "with compute (batch_isend_irecv, async ops).", """\
from torch.distributed.pipelining import ScheduleInterleaved1F1B
schedule = ScheduleInterleaved1F1B(stages, n_microbatches=4 * len(stages), loss_fn=loss_fn)
# hand-written exchanges: start them early, wait late
requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, inp, peer)])
...                                          # compute that does not need `inp`
for request in requests: request.wait()""")
_BROADCAST = ("Broadcasts in every step: DDP broadcasts the module's buffers (BatchNorm's running statistics) "
              "from rank 0 before each forward; switch it off where ranks keep them in step, or broadcast less "
              "often.", """\
model = DistributedDataParallel(model, broadcast_buffers=False)   # buffers stay per rank
# or SyncBatchNorm, which syncs statistics inside the collective it already does""")
_COMM_FIXES = {"all_reduce": _DDP, "all_gather": _FSDP, "reduce_scatter": _FSDP, "all_gather_into_tensor": _FSDP,
               "reduce_scatter_tensor": _FSDP, "send_recv": _POINT_TO_POINT, "send": _POINT_TO_POINT,
               "recv": _POINT_TO_POINT, "all_to_all": _POINT_TO_POINT, "broadcast": _BROADCAST}


def _communicating(ranks: list[RankSummary]) -> str | None:
    """The collective that takes the most time per step across ranks (the median rank's), or None."""
    ops = {op for r in ranks for op in r.collectives}
    if not ops:
        return None
    return max(sorted(ops), key=lambda op: statistics.median(
        r.collectives.get(op, {}).get("seconds_per_step", 0.0) for r in ranks))


def straggler_finding(ranks: list[RankSummary], straggler: int | None, phase: str | None,
                      reason: str | None) -> Finding | None:
    if straggler is None:
        return None
    others = [r for r in ranks if r.rank != straggler]
    own = next(r.wait_s for r in ranks if r.rank == straggler)
    waited = max(statistics.median(r.wait_s for r in others) - own, 0.0)  # what the others wait for it
    step = statistics.median(r.step_s for r in ranks)
    share = waited / step if step > 0 else 0.0
    evidence = {"straggler": straggler, "others_wait_longer_ms_per_step": round(waited * 1e3, 3),
                "straggler_wait_ms_per_step": round(own * 1e3, 3), "step_ms": round(step * 1e3, 3), "phase": phase}
    if phase == "data loading":
        return Finding(
            rule="straggler_dataloader", severity=severity(share), share=round(share, 4),
            title=f"Rank {straggler} is the straggler: its input pipeline holds every rank back "
                  f"(the others wait {share:.0%} of the step for it)",
            evidence=evidence,
            fix=(f"{reason}. Every rank waits for the slowest at each collective, so rank {straggler}'s "
                 "data loading sets the pace for all. Give its DataLoader more workers (and persistent "
                 "ones), and check what differs on that rank: its shard's samples (larger, on slower "
                 "storage), or its host (fewer free cores)."),
            snippet=_LOADER_SNIPPET, verify="%loadertune loader")
    what = f"its {phase}" if phase else "it"
    return Finding(
        rule="straggler_compute", severity=severity(share), share=round(share, 4),
        title=f"Rank {straggler} is the straggler: the others wait {share:.0%} of the step for {what}",
        evidence=evidence,
        fix=(f"{reason}. Uneven work per rank: give each rank batches of the same cost (sort or bucket "
             "samples by length, cap tokens per batch), and if ranks get different numbers of batches, "
             "let the early ones join. On GPUs, a slower or throttled device looks the same: compare "
             "`nvidia-smi -q -d CLOCK,PERFORMANCE` across ranks."),
        snippet=_JOIN_SNIPPET)


def exposed_comm_finding(ranks: list[RankSummary]) -> Finding | None:
    """Communication the step pays for that is not waiting for a straggler: transfers with no
    compute beside them (gradients all-reduced after backward instead of during it).  The
    median rank's, so one rank's waiting does not count."""
    exposed = statistics.median(r.exposed_transfer_s for r in ranks)
    step = statistics.median(r.step_s for r in ranks)
    share = exposed / step if step > 0 else 0.0
    if share < THRESHOLDS["exposed_transfer_share"]:
        return None
    comm = statistics.median(r.comm_s for r in ranks)
    alone = len(ranks) == 1  # no other rank's trace: waiting cannot be told from transfer
    title = (f"Communication: {share:.0%} of the step is collectives with no compute beside them (waiting for "
             "other ranks, or transfers: their traces would tell)" if alone else
             f"Communication: {share:.0%} of the step is transfers with no compute beside them")
    op = _communicating(ranks)
    fix, snippet = _COMM_FIXES.get(op, _DDP)
    if op is not None:
        title += f", most of it {op.replace('_', '-')}"
    return Finding(
        rule="exposed_comm", severity=severity(share), share=round(share, 4),
        title=title,
        evidence={"exposed_ms_per_step": round(exposed * 1e3, 3), "comm_ms_per_step": round(comm * 1e3, 3),
                  "step_ms": round(step * 1e3, 3), "collective": op},
        fix=(("Analyze every rank's trace together first: if the others wait for one rank, fix that rank. " if alone
              else "") + fix + " Then profile again and compare exposed_comm_s."),
        snippet=snippet)


def cross_rank_findings(ranks: list[RankSummary], straggler: int | None, phase: str | None,
                        reason: str | None) -> list[Finding]:
    found = [straggler_finding(ranks, straggler, phase, reason), exposed_comm_finding(ranks)]
    return sorted((f for f in found if f is not None), key=lambda f: -f.share)
