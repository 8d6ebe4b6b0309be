"""Cross-rank findings: a straggler and what it does longer, and communication the step pays for.

Each rule reads the per-rank summaries only, so it is tested on real traces and on numbers.
"""

from __future__ import annotations

import statistics

from ..profile.result import Finding
from ..profile.rules import severity
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

_DDP_SNIPPET = """\
model = DistributedDataParallel(
    model,
    bucket_cap_mb=...,               # larger: fewer all-reduces; smaller: the first starts sooner
    gradient_as_bucket_view=True,    # gradients live in the buckets: no copy in and out
    static_graph=True,               # the same parameters are used every step
)
with model.no_sync():                # gradient accumulation: all-reduce once per optimizer step
    loss.backward()"""


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
    return Finding(
        rule="exposed_comm", severity=severity(share), share=round(share, 4),
        title=title,
        evidence={"exposed_ms_per_step": round(exposed * 1e3, 3), "comm_ms_per_step": round(comm * 1e3, 3),
                  "step_ms": round(step * 1e3, 3)},
        fix=(("Analyze every rank's trace together first: if the others wait for one rank, fix that rank. " if alone
              else "") + "The all-reduce of gradients should run while backward computes the next ones. Tune DDP's "
             "buckets (bucket_cap_mb), keep gradients in them (gradient_as_bucket_view), declare a static "
             "graph, and with gradient accumulation all-reduce once per optimizer step (no_sync). With FSDP, "
             "prefetch the next all-gather (backward_prefetch, forward_prefetch). Then profile again and "
             "compare exposed_comm_s."),
        snippet=_DDP_SNIPPET)


def cross_rank_findings(ranks: list[RankSummary], straggler: int | None, phase: str | None,
                        reason: str | None) -> list[Finding]:
    found = [straggler_finding(ranks, straggler, phase, reason), exposed_comm_finding(ranks)]
    return sorted((f for f in found if f is not None), key=lambda f: -f.share)
