"""A CPU trial's footprint: the process's resident growth over a trial's steps, read in runs of its
own, and what the trial counts of it against the limit.

On CPU the resident growth of the same two steps varies from run to run (a residual CNN with AdamW at
batch 95: 227-287 MiB over 5 runs in one process, with torch allocating 144 every time): glibc's
malloc serves tensors under its mmap threshold, which rises to 32 MiB, from a heap whose freed pages
stay resident in varying amounts.  So reads that disagree count as what one more run could take, from
the reads of the trial and of its neighbours in the search (a line through their reads against torch's
allocations, which vary alike about it): a run the search did not make can take more than the ones it
did.  In a fresh process (``--fresh``) the reads also hold the libraries' first-use memory, the same
whatever the size: the line's intercept, where a ratio to the allocations would grow with the size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...core.devices import Device
from ...core.measure.stats import upper_line_prediction_bound, upper_prediction_bound
from ...core.render.format import fmt_bytes
from .search import TRIAL_STEPS, Probe

# Runs that read a trial's footprint (fewest, most): more than the fewest only while they disagree
FOOTPRINT_RUNS = (2, 5)
# Reads agree within 2%, or within 1 MiB (a few pages more or less on a small step do not matter).
FOOTPRINT_AGREEMENT = 0.02
FOOTPRINT_AGREEMENT_BYTES = 2**20
# Neighbours whose reads count with a trial's: torch allocated within this factor of its allocations
NEIGHBOURS = 2.0
NEIGHBOUR_READS = 3  # reads at neighbouring sizes before two alike end a trial's reads


def read_footprints(step: Callable[[int], Any], size: int, device: Device, reset: Callable[..., None],
                    runs: tuple[int, int] = FOOTPRINT_RUNS) -> tuple[int, ...]:
    """The footprint of ``TRIAL_STEPS`` steps at ``size``, read in ``runs`` (fewest, most) runs without
    the profiler (its event buffers are resident memory too), each from the user's state (``reset``
    puts it back); more than the fewest only while the reads disagree.  Empty where the device has no
    footprint to read apart (CUDA: its peak scope reads what the allocator reserved)."""
    __tracebackhide__ = True  # noqa: F841

    def read_once() -> int | None:
        __tracebackhide__ = True  # noqa: F841
        scope = device.footprint_scope()
        if scope is None:
            return None
        with scope as own:
            for _ in range(TRIAL_STEPS):
                step(size)
        reset(collect=False)
        return own.footprint_bytes

    return read_until_agreed(read_once, runs)


def read_until_agreed(read_once: Callable[[], int | None], runs: tuple[int, int],
                      reads: tuple[int, ...] = ()) -> tuple[int, ...]:
    """``reads`` and more from ``read_once`` until there are the fewest of ``runs`` and they agree, or
    the most; where ``read_once`` has nothing to read (None), what was read before it."""
    __tracebackhide__ = True  # noqa: F841
    least, most = runs
    reads = list(reads)
    while len(reads) < most and not (len(reads) >= least and agree(reads)):
        read = read_once()
        if read is None:
            break
        reads.append(read)
    return tuple(reads)


def agree(reads) -> bool:
    return not reads or max(reads) - min(reads) <= max(FOOTPRINT_AGREEMENT * min(reads), FOOTPRINT_AGREEMENT_BYTES)


class FootprintCount:
    """What each trial of one search counts against the limit, from its reads and its neighbours'."""

    def __init__(self, runs: tuple[int, int] = FOOTPRINT_RUNS):
        self.runs = runs  # each trial's reads (fewest, most): ranks, in lockstep, read a fixed number
        self.reads: list[tuple[int, int]] = []  # (torch's allocations, a footprint read) of every trial so far

    def runs_for(self, allocated: int | None) -> tuple[int, int]:
        """The fewest and most runs for a trial that allocated ``allocated``: at least three where its
        neighbours were read fewer times (two reads alike say little: glibc's heap often gives the same
        two in a row, then another), so the first trial near a size knows how much its reads vary."""
        least, most = self.runs
        if allocated and len(self._near(allocated)) < NEIGHBOUR_READS:
            least = max(least, min(most, NEIGHBOUR_READS))
        return least, most

    def counted(self, reads: tuple[int, ...], allocated: int | None) -> int:
        """The most read where the reads of this trial and its neighbours (torch allocated within a
        factor of 2) agree, per byte allocated; where they do not, the upper 95% prediction bound for
        one more run's read at this trial's allocations, from the line through the neighbours' reads
        against their allocations (a read is a fixed part, large in a fresh process's first steps,
        and a part that grows with the allocations), or, where they were all at one size, from the
        trial's own reads.  Never less than the most read."""
        most = max(reads)
        if not allocated:
            return most if agree(reads) else max(most, round(upper_prediction_bound(list(reads))))
        self.reads += [(allocated, read) for read in reads]
        near = self._near(allocated)
        if agree([round(read * allocated / a) for a, read in near]):
            return most
        bound = upper_line_prediction_bound(near, allocated)
        return max(most, round(bound if bound is not None else upper_prediction_bound(list(reads))))

    def _near(self, allocated: int) -> list[tuple[int, int]]:
        return [(a, read) for a, read in self.reads if allocated / NEIGHBOURS <= a <= allocated * NEIGHBOURS]


def varied_footprint_note(probes: list[Probe], fresh: bool = False) -> list[str]:
    """Where a trial's footprint reads disagreed: by how much, why, and what would steady it.  ``fresh``:
    each read was in a process of its own (``--fresh``)."""
    varied = [p for p in probes if p.footprint_reads and (not agree(p.footprint_reads)
                                                          or (p.peak_bytes or 0) > max(p.footprint_reads))]
    if not varied:
        return []
    widest = max(varied, key=lambda p: max(p.footprint_reads) - min(p.footprint_reads))  # a read can be 0
    reads = widest.footprint_reads
    run, runs = ("process", "processes") if fresh else ("run", "runs")
    torch_share = f", torch allocating {fmt_bytes(widest.allocated_bytes)} each time" if widest.allocated_bytes else ""
    return [f"Resident memory differed from {run} to {run} of the same {TRIAL_STEPS} steps (batch "
            f"{widest.batch_size}: {fmt_bytes(min(reads))} to {fmt_bytes(max(reads))} over {len(reads)} {runs}"
            f"{torch_share}): glibc's malloc keeps tensors under its mmap threshold (which rises to 32 MiB) in a heap "
            f"whose freed pages stay resident in varying amounts. Where reads differed, a trial counts what one more "
            f"{run} could take (the upper 95% prediction bound from the line through its and its neighbours' reads "
            f"against torch's allocations, never less than the most read), and a {run} can still take more: keep a "
            "margin. " + ("" if fresh else "A script's first steps can take more than a warmed notebook's "
                          "(the libraries' first use of memory, a heap that starts new): %%autobatch --fresh step "
                          "reads each trial in processes started for it. ") +
            "A process started with MALLOC_MMAP_THRESHOLD_=1048576 in its environment gives each tensor from "
            "1 MiB its own pages, so its resident memory stays near torch's allocations and varies less, "
            "but each such tensor then costs page faults: its steps can run 2x slower."]
