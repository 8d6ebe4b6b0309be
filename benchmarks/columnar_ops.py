"""A probe for issue 34's redesign: the operator table's core (calls, self and total time per op name) computed
over columns with torch, against torchmagic's own operator pass on the same trace.

    python -m benchmarks.columnar_ops [--sizes 50,250]

Each trace is the tiled DDP rank of ``benchmarks.trace_analysis``.  The columns are the host events' start,
duration, thread, name and category, read from the typed records of the reader's slices; each event's parent
is found without a loop (sorted by thread, start and end descending, an event's depth is how many earlier
events of its thread are still open; its parent the last earlier event one level up), its children's time
subtracted with one scatter.  Every op row is checked against torchmagic's operator pass (``operator_summary``,
as ``torchmagic.analyze`` runs it): calls exactly, times to 0.05 µs.  What it leaves out, which the real sweep does: events that are not properly nested (a child
that outlives its parent), zero-length events sharing a start, steps, categories, launches and kernels.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from benchmarks.machine import machine_line
from benchmarks.trace_analysis import make_template, write_tiled
from torchmagic.core.gc_pause import gc_paused
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
    """Each event's duration less its direct children's (ns), for properly nested events per thread."""
    n, end = len(start), start + length
    order = torch.argsort(-end, stable=True)
    order = order[torch.argsort(start[order], stable=True)]
    order = order[torch.argsort(thread[order], stable=True)]
    s, e, t = start[order] - start.min(), end[order] - start.min(), thread[order]
    span, index = int(e.max()) + 1, torch.arange(n)
    counts = torch.bincount(t)
    first = (torch.cumsum(counts, 0) - counts)[t]  # where each event's thread begins in the sorted order
    closed = torch.searchsorted(torch.sort(t * span + e).values, t * span + s, right=True) - first
    depth = index - first - closed
    levels = int(depth.max()) + 2
    keys = torch.sort((t * levels + depth) * n + index).values
    at = torch.searchsorted(keys, (t * levels + depth - 1) * n + index) - 1
    parent_key = keys[at.clamp(min=0)]
    has_parent = (depth > 0) & (at >= 0) & (parent_key // n == t * levels + depth - 1)
    children = torch.zeros(n, dtype=torch.long).scatter_add_(0, (parent_key % n)[has_parent], (e - s)[has_parent])
    out = torch.empty(n, dtype=torch.long)
    out[order] = (e - s - children).clamp(min=0)
    return out


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,250", help="trace sizes in MB")
    args = parser.parse_args()
    print(machine_line())
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
