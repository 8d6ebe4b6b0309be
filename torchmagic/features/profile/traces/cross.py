"""Across ranks: each rank's time per step by what it did, each collective's wait and transfer,
and the straggler the others wait for.

**Wait vs transfer.**  A collective finishes on every rank at about the same moment, so a rank
that arrives early spends the difference waiting.  The k-th collective of an op within a step is
the same collective on every rank (ranks issue them in the same order), so its shortest duration
across ranks, that of the last to arrive, is the transfer; the rest of each rank's duration is
waiting.  This uses durations only, so it holds across hosts whose clocks disagree.

**The straggler** is the rank the others wait for: the one that waits least, when step by step
the others' median wait exceeds its own by at least ``STRAGGLER_SHARE`` of the step in the median
step (``find_straggler``).  What it does longer is the
phase (data loading, forward, backward, optimizer, or device compute) where it spends the most
time per step above the other ranks' median.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from ....core.render.format import fmt_s
from ..intervals import IntervalSet
from .rank import Collective, RankTrace, window_of
from .reader import shown_path
from .result import RankSummary, StepLane

STRAGGLER_SHARE = 0.05   # the others wait this share of a step longer than the straggler, at least
MIN_STRAGGLER_S = 2e-4   # ... and at least this long (below, waits are noise)
US = 1e-6


def summarize_rank(trace: RankTrace, matched: list[Matched]) -> RankSummary:
    """Per-step averages (seconds) over the rank's profiled steps."""
    windows = trace.windows()
    n = max(len(windows), 1)
    comm, work = trace.comm, trace.hiding
    active = work.union(trace.data, comm)

    step_spans = [(s, e) for _, s, e in windows]

    def per_step(intervals) -> float:
        return sum(intervals.within_each(step_spans)) / n * US

    starts = [s for _, s, _ in windows]

    def in_steps(t: float) -> bool:
        return window_of(windows, starts, t) is not None

    step_s = sum(e - s for _, s, e in windows) / n * US
    data_s = per_step(trace.data)
    launched = trace.launched_compute() if trace.on_device else None
    # a GPU's compute per step is what the step launched; else what ran inside it
    compute_s = sum(launched) / n * US if launched is not None else per_step(trace.compute)
    backward_s, optimizer_s = per_step(trace.backward), per_step(trace.optimizer)
    host_work = trace.host_busy.minus(trace.data)
    phases = {"data loading": data_s,
              "forward and other": per_step(host_work.minus(trace.backward.union(trace.optimizer))),
              "backward": backward_s,
              "optimizer": optimizer_s}
    if trace.on_device:
        phases["device compute"] = compute_s
    # A matched collective waits first and transfers last: its last `transfer` µs are the transfer.
    # As unions clipped to the steps, like comm_s (collectives overlap on a backend's threads), and
    # waiting while another collective transfers counts as transfer: wait_s + transfer_s <= comm_s.
    heads = IntervalSet.of([(m.start, m.start + m.dur - m.transfer) for m in matched])
    tails = IntervalSet.of([(m.start + m.dur - m.transfer, m.start + m.dur) for m in matched])
    spans: dict[str, list] = defaultdict(list)  # each op's runs, as a union: a backend runs some at once
    for c in sorted(trace.collectives, key=lambda c: c.start):
        if in_steps(c.start):
            spans[c.op].append((c.start, c.start + c.dur))
    collectives = {}
    for op, runs in spans.items():  # record_param_comms says "allreduce", "_allgather_base" ...
        key = op.replace("_", "")
        described = sum(b for name, b in trace.comm_bytes.items() if name.startswith(key))
        collectives[op] = {"calls": len(runs), "seconds_per_step": per_step(IntervalSet.of(runs)),
                           "bytes": described or None}
    waiting = heads.minus(tails)
    step_waits = {number: us * US for (number, _, _), us in zip(windows, waiting.within_each(step_spans))
                  if number is not None}
    return RankSummary(
        rank=trace.rank, path=shown_path(trace.path), device="gpu" if trace.on_device else "cpu",
        step_waits_s=step_waits,
        steps=len(trace.steps), step_s=step_s, compute_s=compute_s, comm_s=per_step(comm),
        exposed_comm_s=per_step(comm.minus(work)), wait_s=per_step(waiting), transfer_s=per_step(tails),
        exposed_transfer_s=per_step(tails.minus(work)), dataloader_s=data_s,
        idle_s=max(step_s - per_step(active), 0.0), phases_s=phases, collectives=collectives,
        events=trace.events)


@dataclass(frozen=True)
class Matched:
    """A collective found on every rank: this rank's start and duration (µs), and the transfer
    (the shortest duration across ranks)."""

    start: float
    dur: float
    transfer: float


def match_collectives(traces: list[RankTrace]) -> tuple[list[list[Matched]], int]:
    """Each rank's collectives matched across ranks, and how many could not be (cut short by the
    end of profiling, or missing on some rank).  One rank alone: each is its own transfer."""
    if len(traces) == 1:
        return [[Matched(c.start, c.dur, c.dur) for c in traces[0].collectives if c.finished]], 0
    grouped = []  # per rank: (step, op) -> its collectives in start order
    for trace in traces:
        windows = trace.windows()
        starts = [s for _, s, _ in windows]
        by_key: dict[tuple, list[Collective]] = defaultdict(list)
        for c in sorted(trace.collectives, key=lambda c: c.start):
            window = window_of(windows, starts, c.start)
            by_key[(window[0] if window else "outside", c.op)].append(c)
        grouped.append(by_key)
    matched: list[list[Matched]] = [[] for _ in traces]
    unmatched = 0
    for key in set().union(*grouped):
        lists = [g.get(key, []) for g in grouped]
        common = min(len(found) for found in lists) if key[0] != "outside" else 0
        unmatched += max(len(found) for found in lists) - common
        for k in range(common):
            instance = [found[k] for found in lists]
            if not all(c.finished for c in instance):
                unmatched += 1
                continue
            transfer = min(c.dur for c in instance)
            for rank_matched, c in zip(matched, instance):
                rank_matched.append(Matched(c.start, c.dur, transfer))
    return matched, unmatched


def find_straggler(ranks: list[RankSummary]) -> tuple[int | None, str | None, str | None]:
    """(straggler rank, the phase it spends longer in, one line saying so), or Nones.

    The candidate is the rank that waits least; it is the straggler when, step by step, the
    others' median wait exceeds its own by at least ``STRAGGLER_SHARE`` of the step in the median
    step (one noisy step, or ranks taking turns to be late, do not make a straggler)."""
    if len(ranks) < 2:
        return None, None, None
    candidate = min(ranks, key=lambda r: r.wait_s)
    others = [r for r in ranks if r is not candidate]
    step = statistics.median(r.step_s for r in ranks)
    lead = _median_lead(candidate, others)
    if lead < max(STRAGGLER_SHARE * step, MIN_STRAGGLER_S):
        return None, None, None
    excess = {phase: seconds - statistics.median(r.phases_s.get(phase, 0.0) for r in others)
              for phase, seconds in candidate.phases_s.items()}
    phase, longer = max(excess.items(), key=lambda item: item[1])
    if longer <= 0.25 * lead:
        return candidate.rank, None, (f"rank {candidate.rank} is the one the others wait for "
                                      f"({_ms(lead)} per step); no one phase of it is longer than on the others")
    return candidate.rank, phase, (f"rank {candidate.rank} spends {_ms(longer)} more per step in {phase} than the "
                                   f"other ranks (median), and they wait {_ms(lead)} per step longer for it")


def _median_lead(candidate: RankSummary, others: list[RankSummary]) -> float:
    """The others' median wait less the candidate's, step by step, then the median over steps
    (without step markers: the averages)."""
    common = set(candidate.step_waits_s).intersection(*(r.step_waits_s for r in others))
    if not common:
        return statistics.median(r.wait_s for r in others) - candidate.wait_s
    return statistics.median(statistics.median(r.step_waits_s[n] for r in others) - candidate.step_waits_s[n]
                             for n in common)


def representative_lanes(traces: list[RankTrace]) -> tuple[int | None, list[StepLane]]:
    """One step drawn per rank, each from its own start (clocks may differ across hosts): the
    step number all ranks profiled whose slowest rank took the median time."""
    common = set.intersection(*(set(t.steps) for t in traces)) if traces else set()
    if common:
        longest = {n: max(t.steps[n][1] - t.steps[n][0] for t in traces) for n in common}
        ordered = sorted(common, key=longest.get)
        number = ordered[len(ordered) // 2]
    else:
        number = None
    lanes = []
    for trace in traces:
        window = trace.steps.get(number) if number is not None else trace.span
        if window is None:
            continue
        start, end = window
        exposed = trace.comm.minus(trace.hiding)

        def rel(pieces):
            return [((s - start) * US, (e - s) * US) for s, e in pieces]

        lanes.append(StepLane(rank=trace.rank, step=number, step_s=(end - start) * US,
                              spans={"compute": rel(trace.compute.clipped(start, end)),
                                     "data loading": rel(trace.data.clipped(start, end)),
                                     "communication (exposed)": rel(exposed.clipped(start, end)),
                                     "communication (overlapped)": rel(trace.comm.minus(exposed).clipped(start, end))}))
    return number, lanes


def _ms(seconds: float) -> str:
    return fmt_s(seconds)
