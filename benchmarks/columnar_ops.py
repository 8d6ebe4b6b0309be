"""The operator report's two paths on one trace, side by side (issue 34): the columnar summary
(traces/columnar.py, what ``torchmagic.analyze`` uses for a trace the columns cover) against the events path
(ops.py's sweep over one adapter object per event, what it uses for any other: FLOPs recorded, values refused).

    python -m benchmarks.columnar_ops [--sizes 50,250] [--real] [--template TRACE]

Each trace is the tiled DDP rank of ``benchmarks.trace_analysis`` (CPU; host work only), or the trace file
``--template`` tiled the same way (tests/data/traces/hta_resnet_host_ahead_rank-0.json.gz: a real GPU job's,
kernels and runtime calls included).  The per-rank pass reads it once, the
columns alongside (timed with and without them); then, each timed, the columnar summary of those columns, and
the events path's operator pass (a second reading of the file into groups of steps, spilled, then summarised),
both over the same groups of steps.  Every field of the two summaries is compared: equal, floats to 1e-9 of
their value (the sums are taken in another order).  ``--real`` checks the nesting (tree.py) against the sweep's
stack on every real trace under tests/data, GPU ones included: each host event's self time as the sweep closes
it, against the tree's (tests/profile/traces/test_columnar.py compares every field of the two summaries there).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import math
import os
import tempfile
import time

import torch

from benchmarks.machine import machine_line
from benchmarks.trace_analysis import make_template, read_template, write_tiled
from torchmagic.core.gc_pause import gc_paused
from torchmagic.features.profile.events import MEMORY
from torchmagic.features.profile.summary import TraceSummary
from torchmagic.features.profile.sweep import Sweep
from torchmagic.features.profile.traces.columnar import columnar_summary
from torchmagic.features.profile.traces.columns import ColumnReading
from torchmagic.features.profile.traces.ops import OPS_EVENT_LIMIT, operator_summary
from torchmagic.features.profile.traces.rank import read_rank
from torchmagic.features.profile.traces.sliced import SlicedTraceReader
from torchmagic.features.profile.traces.tree import event_tree


def differing(a, b, where: str = "") -> list[str]:
    """Where two summaries (or parts of them) differ: keys, lengths, values; floats beyond 1e-9 of their value."""
    if dataclasses.is_dataclass(b):
        return [d for f in dataclasses.fields(b) for d in differing(getattr(a, f.name), getattr(b, f.name),
                                                                       f"{where}.{f.name}")]
    if isinstance(b, dict):
        if list(a) != list(b):
            return [f"{where}: keys"]
        return [d for key in b for d in differing(a[key], b[key], f"{where}[{key!r}]")]
    if isinstance(b, (list, tuple)) or hasattr(b, "typecode"):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items against {len(b)}"]
        return [d for x, y in zip(a, b) for d in differing(x, y, where)][:1]
    if isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6) else [f"{where}: {a} against {b}"]
    return [] if a == b else [f"{where}: {a!r} against {b!r}"]


def both_paths(path: str) -> dict:
    """Seconds of each part, and the fields where the two summaries differ."""
    with gc_paused():
        started = time.perf_counter()
        read_rank(SlicedTraceReader(path), path)
        alone = time.perf_counter() - started
        reading = ColumnReading(path)
        started = time.perf_counter()
        trace = read_rank(SlicedTraceReader(path), path, reading)
        with_columns = time.perf_counter() - started
        started = time.perf_counter()
        columnar, _, _ = columnar_summary(reading.columns, trace, OPS_EVENT_LIMIT)
        summary_s = time.perf_counter() - started
        started = time.perf_counter()
        events, _ = operator_summary(trace, OPS_EVENT_LIMIT)
        events_s = time.perf_counter() - started
    return {"ranks": alone, "columns": with_columns - alone, "columnar": summary_s, "events": events_s,
            "differing": differing(columnar, events, "summary"), "ops": len(events.ops)}


def sweep_self_times_agree(path: str) -> tuple[int, int]:
    """(events, how many differ): each thread's events as the sweep is handed them, their self times by the
    sweep's stack (recorded as it closes each) against the tree's."""
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
        trace = read_rank(SlicedTraceReader(path), path)
        operator_summary(trace, trace.events)  # the events path, whatever the trace holds
    finally:
        Sweep.run, Sweep._close = run, close
    events = differ = 0
    for evs in filter(None, handed):
        start = torch.tensor([ev.start for ev in evs], dtype=torch.float64)
        end = torch.tensor([ev.end for ev in evs], dtype=torch.float64)
        tree = event_tree(torch.zeros(len(evs), dtype=torch.long), start, end)
        s, e, has = start[tree.order], end[tree.order], tree.parent >= 0
        ours = torch.empty(len(evs), dtype=torch.float64)
        ours[tree.order] = (e - s - torch.zeros(len(evs), dtype=torch.float64).scatter_add_(
            0, tree.parent[has], (e - s)[has])).clamp(min=0)
        sweep = torch.tensor([closed[id(ev)] for ev in evs], dtype=torch.float64)
        events, differ = events + len(evs), differ + int(((ours - sweep).abs() > 1e-6).sum())
    return events, differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,250", help="trace sizes in MB")
    parser.add_argument("--real", action="store_true", help="check the nesting on the real traces in tests/data")
    parser.add_argument("--template", help="a trace file to tile instead of the CPU DDP job profiled here")
    args = parser.parse_args()
    print(machine_line())
    if args.real:
        data = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
        for path in sorted(glob.glob(os.path.join(data, "**", "*.json.gz"), recursive=True)):
            events, differ = sweep_self_times_agree(path)
            print(f"{os.path.basename(path)}: {events:,} host events, self times differing from the sweep's: {differ}")
    with tempfile.TemporaryDirectory() as tmp:
        template = read_template(args.template) if args.template else make_template(tmp)
        for size in (float(s) for s in args.sizes.split(",")):
            path = os.path.join(tmp, f"{size:g}MB.json")
            events = write_tiled(template, path, size)
            r = both_paths(path)
            print(f"{os.path.getsize(path) / 1e6:6.0f} MB, {events:,} events: per-rank pass {r['ranks']:.2f} s, "
                  f"+{r['columns']:.2f} s reading the columns alongside; columnar summary {r['columnar']:.2f} s; "
                  f"the events path's operator pass {r['events']:.2f} s "
                  f"({r['events'] / (r['columns'] + r['columnar']):.1f}x the columns and their summary); "
                  f"{r['ops']} op rows; fields differing: {r['differing'][:3] or 'none'}", flush=True)
            os.remove(path)


if __name__ == "__main__":
    main()
