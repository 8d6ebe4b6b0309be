"""A probe for issue 34's redesign: the operator table's core (calls, self and total time per op name) computed
over columns with torch, against torchmagic's own operator pass on the same trace.

    python -m benchmarks.columnar_ops [--sizes 50,250] [--real]

Each trace is the tiled DDP rank of ``benchmarks.trace_analysis``.  The columns are the host events' start,
duration, thread, name and category, read from the typed records of the reader's slices; each event's parent
is found without a loop, exactly as the sweep's stack finds it (``stack_self_times``: effective ends, so a
child that outlives its parent and zero-length events sharing a start come out the same), its children's
time subtracted with one scatter.  Every op row is checked against torchmagic's operator pass
(``operator_summary``, as ``torchmagic.analyze`` runs it): calls exactly, times to 0.05 µs.  ``--real``
checks every event's self time against the sweep's own, on the events the sweep is handed, over the real
traces checked in under tests/data.  What it leaves out, which the real sweep does: steps, categories and
the context children inherit, launches and kernels, memory, Python gaps.
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile
import time

import torch

import torchmagic
from benchmarks.machine import machine_line
from benchmarks.trace_analysis import make_template, write_tiled
from torchmagic.core.gc_pause import gc_paused
from torchmagic.features.profile.events import MEMORY
from torchmagic.features.profile.sweep import Sweep
from torchmagic.features.profile.kineto import CPU_OP, DEVICE_ACTIVITIES, UNREAD_ON_PURPOSE
from torchmagic.features.profile.traces.ops import OPS_EVENT_LIMIT, operator_summary
from torchmagic.features.profile.traces.rank import read_rank
from torchmagic.features.profile.traces.sliced import SlicedTraceReader

# what the operator pass does not sweep as host events: the device's, and what it sets aside unread
NOT_HOST = DEVICE_ACTIVITIES | UNREAD_ON_PURPOSE


def host_columns(path: str) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """The host events' columns (times in ns), and the ids given to names and categories."""
    names, categories, threads = {}, {}, {}
    ts, dur, tid, name, cat = [], [], [], [], []
    for batch in SlicedTraceReader(path):
        if batch.records is None:
            continue
        host = [r for r in batch.records if r.ph == "X" and r.cat not in NOT_HOST]
        ts += [r.ts for r in host]
        dur += [r.dur for r in host]
        tid += [threads.setdefault(r.tid, len(threads)) for r in host]
        name += [names.setdefault(r.name, len(names)) for r in host]
        cat += [categories.setdefault(r.cat, len(categories)) for r in host]
    start = (torch.tensor(ts, dtype=torch.float64) * 1000).round().long()
    length = (torch.tensor(dur, dtype=torch.float64) * 1000).round().long()
    return ({"start": start, "length": length, "thread": torch.tensor(tid), "name": torch.tensor(name),
             "category": torch.tensor(cat)}, names, categories)


def self_times(start: torch.Tensor, length: torch.Tensor, thread: torch.Tensor) -> torch.Tensor:
    """Each event's duration less its direct children's (ns), per thread, exactly as the sweep's stack gives them."""
    end, out = start + length, torch.empty(len(start), dtype=torch.long)
    for t in torch.unique(thread).tolist():
        mine = (thread == t).nonzero().flatten()
        out[mine] = stack_self_times(start[mine], end[mine])
    return out


def stack_self_times(start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """One thread's self times as sweep.Sweep's stack makes them, without a loop over events.

    The sweep visits events by (start, end descending, file order) and pops the top of its stack while it
    ended by the next event's start, so an event stays open until everything above it has closed: its
    *effective end* is the latest end in its subtree (a child may outlive its parent).  With effective ends
    the open events at any start form a chain: an event's depth is the earlier events whose effective end
    is after its start (one ending exactly at its start is closed, as ``end <= start`` pops it), and its
    parent the last earlier event one level up.  The effective ends depend on the parents, so the two are
    iterated to a fixed point (one round for properly nested events)."""
    n = len(start)
    order = torch.argsort(-end, stable=True)
    order = order[torch.argsort(start[order], stable=True)]
    s, e, index = start[order], end[order], torch.arange(n)
    effective, parent = e.clone(), None
    for _ in range(n + 1):
        depth = index - _closed_before(s, effective)
        new_parent = _last_one_level_up(depth)
        new_effective = e.clone()
        for level in range(int(depth.max()), 0, -1):  # bottom up: a subtree's latest end
            at = (depth == level) & (new_parent >= 0)
            new_effective.scatter_reduce_(0, new_parent[at], new_effective[at], reduce="amax")
        if parent is not None and torch.equal(new_parent, parent) and torch.equal(new_effective, effective):
            break
        parent, effective = new_parent, new_effective
    has = parent >= 0
    children = torch.zeros(n, dtype=e.dtype).scatter_add_(0, parent[has], (e - s)[has])
    out = torch.empty(n, dtype=e.dtype)
    out[order] = (e - s - children).clamp(min=0)
    return out


def _closed_before(s: torch.Tensor, effective: torch.Tensor) -> torch.Tensor:
    """Per event (in visiting order), the earlier events closed by its start: effective end before it, or at
    it (a zero-length event at the same start visited earlier).  One sorted key: rank of the effective end,
    then position, searched at (rank of this start, this position), or (rank, 0) where no end equals it."""
    n = len(s)
    values, rank = torch.unique(effective, sorted=True, return_inverse=True)
    keys = torch.sort(rank * n + torch.arange(n)).values
    at = torch.searchsorted(values, s)
    equal = values[at.clamp(max=len(values) - 1)] == s
    return torch.searchsorted(keys, at * n + torch.where(equal, torch.arange(n), torch.zeros_like(at)))


def _last_one_level_up(depth: torch.Tensor) -> torch.Tensor:
    """Per event, the last earlier event at one depth less (its parent), or -1 at depth 0."""
    n = len(depth)
    index = torch.arange(n)
    keys = torch.sort(depth * n + index).values
    at = torch.searchsorted(keys, (depth - 1) * n + index) - 1
    found = keys[at.clamp(min=0)]
    has = (depth > 0) & (at >= 0) & (found // n == depth - 1)
    return torch.where(has, found % n, torch.full_like(index, -1))


def columnar_table(path: str) -> dict[str, tuple[int, float, float]]:
    columns, names, categories = host_columns(path)
    ops = columns["category"] == categories.get(CPU_OP, -1)
    name, k = columns["name"][ops], len(names)
    self_ns = self_times(columns["start"], columns["length"], columns["thread"])[ops]
    calls = torch.bincount(name, minlength=k)
    self_us = torch.zeros(k, dtype=torch.float64).scatter_add_(0, name, self_ns.double() / 1000)
    total_us = torch.zeros(k, dtype=torch.float64).scatter_add_(0, name, columns["length"][ops].double() / 1000)
    return {key: (int(calls[i]), float(self_us[i]), float(total_us[i])) for key, i in names.items() if calls[i]}


def torchmagic_operator_pass(path: str) -> tuple[dict[str, tuple[int, float, float]], float]:
    """torchmagic's operator table of the trace, and the seconds its operator pass took (the per-rank pass
    it needs first is not counted), with the collector paused as the reader pauses it."""
    trace = read_rank(SlicedTraceReader(path), path)
    with gc_paused():
        started = time.perf_counter()
        summary, _ = operator_summary(trace, OPS_EVENT_LIMIT)
        seconds = time.perf_counter() - started
    return {name: (s.calls, s.self_cpu_us, s.total_cpu_us) for name, s in summary.ops.items()}, seconds


def columnar_operator_table(path: str) -> tuple[dict[str, tuple[int, float, float]], float]:
    with gc_paused():
        started = time.perf_counter()
        table = columnar_table(path)
        return table, time.perf_counter() - started


def sweep_self_times_agree(path: str) -> tuple[int, int]:
    """(events, how many differ): each thread's events as the sweep is handed them, their self times by the
    sweep's stack (recorded as it closes each) against ``stack_self_times``."""
    handed, closed = [], {}
    run, close = Sweep.run, Sweep._close

    def recording_run(self, evs, lane):
        handed.append([ev for ev in evs if ev.kind != MEMORY])  # never pushed on the stack
        run(self, evs, lane)

    def recording_close(self, entry, lane):
        closed[id(entry[0])] = max(entry[0].end - entry[0].start - entry[1], 0.0)
        close(self, entry, lane)

    Sweep.run, Sweep._close = recording_run, recording_close
    try:
        torchmagic.analyze(path)
    finally:
        Sweep.run, Sweep._close = run, close
    events = differ = 0
    for evs in filter(None, handed):
        ours = stack_self_times(torch.tensor([ev.start for ev in evs], dtype=torch.float64),
                                torch.tensor([ev.end for ev in evs], dtype=torch.float64))
        sweep = torch.tensor([closed[id(ev)] for ev in evs], dtype=torch.float64)
        events, differ = events + len(evs), differ + int(((ours - sweep).abs() > 1e-6).sum())
    return events, differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,250", help="trace sizes in MB")
    parser.add_argument("--real", action="store_true", help="check self times on the real traces in tests/data")
    args = parser.parse_args()
    print(machine_line())
    if args.real:
        data = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
        for path in sorted(glob.glob(os.path.join(data, "**", "*.json.gz"), recursive=True)):
            events, differ = sweep_self_times_agree(path)
            print(f"{os.path.basename(path)}: {events:,} host events, self times differing from the sweep's: {differ}")
    with tempfile.TemporaryDirectory() as tmp:
        template = make_template(tmp)
        for size in (float(s) for s in args.sizes.split(",")):
            path = os.path.join(tmp, f"{size:g}MB.json")
            events = write_tiled(template, path, size)
            columnar, columnar_s = columnar_operator_table(path)
            ours, ours_s = torchmagic_operator_pass(path)
            differing = [name for name, (calls, self_us, total_us) in columnar.items()
                         if name not in ours or ours[name][0] != calls
                         or abs(ours[name][1] - self_us) > 0.05 or abs(ours[name][2] - total_us) > 0.05]
            print(f"{os.path.getsize(path) / 1e6:6.0f} MB, {events:,} events: columns + table {columnar_s:.2f} s; "
                  f"torchmagic's operator pass {ours_s:.2f} s ({ours_s / columnar_s:.1f}x); "
                  f"op rows differing: {len(differing)} of {len(columnar)}{' ' + str(differing[:3]) if differing else ''}",
                  flush=True)
            os.remove(path)


if __name__ == "__main__":
    main()
