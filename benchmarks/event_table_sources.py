"""Where the one event table of issue 52 is filled from, for a live profile: kineto's events read into the
columns (live_table.py, the live path since issue 52), against the profiler's own Chrome-trace export read as a
file (the path trace files take). And how far they agree on the same profile.  (The events path, kineto's events
swept one by one, was measured here too until it was removed: docs/performance.md keeps its figures.)

For each workload, one profile (CPU activities, ``record_shapes=True`` as ``%%torchprofile`` profiles,
``ProfilerStep#N`` ranges around each step, as the magic marks them), exported once (kineto saves a trace
once), then the two summaries interleaved over ``--reps`` rounds:

=================  ==========================================================================================
live columns       ``summarize_live(results)``: kineto's events read into columns, then the table summary
export             ``prof.export_chrome_trace(path)``: kineto writes the JSON (C++), gzip off
file summary       the file read as ``--load`` reads it: into the event table, then the per-rank pass and
                   the operator summary over it
=================  ==========================================================================================

The export is not a faithful copy: torch 2.13's writer names a range "unknown" where it holds a control
character or text that is not ASCII, and leaves a double quote unescaped (tests/profile/test_trace.py).

Printed per workload: events, median seconds of each (and µs per event), and how the live columns' summary
agrees with the file's: median step, and the largest difference of a category's share of the steps (points).

Run ``python -m benchmarks.event_table_sources`` from the repository root (``--help``); about a minute.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

import torch
from torch import nn

from benchmarks.machine import machine_line
from torchmagic.features.profile.kineto import STEP_PREFIX
from torchmagic.features.profile.live_table import summarize_live
from torchmagic.features.profile.traces.ops import GROUP_EVENTS, operator_summary
from torchmagic.features.profile.traces.run import read_rank


def _conv_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def _mlp_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def _tiny_adds_step(adds: int):
    x = torch.zeros(4)

    def step():
        nonlocal x
        for _ in range(adds):
            x = x + 1
    return step


WORKLOADS = {
    "conv": ("CIFAR-sized conv net, SGD, batch 32", _conv_step, 10),
    "mlp": ("3-layer MLP 256-512-512-10, Adam, batch 64", _mlp_step, 10),
    "tiny-adds": ("x = x + 1 on 4 floats, 2,000 a step: dispatch-bound, a large profile",
                  lambda: _tiny_adds_step(2000), 10),
}


def _profile(step, steps: int):
    step()  # warm-up, as the magic's
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for i in range(steps):
            with torch.profiler.record_function(f"{STEP_PREFIX}{i}"):  # the magic's step markers
                step()
    return prof


def _timed(fn):
    gc.collect()
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def _file_summary(path: str):
    trace, columns = read_rank(path)
    return operator_summary(trace, columns, GROUP_EVENTS)


def _shares(summary) -> dict[str, float]:
    total = sum(summary.category_us.values()) or 1.0
    return {name: us / total for name, us in summary.category_us.items()}


def bench(name: str, reps: int, log=print) -> dict:
    about, make, steps = WORKLOADS[name]
    prof = _profile(make(), steps)
    results = prof.profiler.kineto_results
    events = len(results.events())
    times = {"live columns": [], "export": [], "file summary": []}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        t, _ = _timed(lambda: prof.export_chrome_trace(path))  # once: kineto saves a trace once
        times["export"].append(t)
        for _ in range(reps):
            t, (live, _) = _timed(lambda: summarize_live(results, shapes=True))
            times["live columns"].append(t)
            t, filed = _timed(lambda: _file_summary(path))
            times["file summary"].append(t)
        size = os.path.getsize(path)
    live_shares, file_shares = _shares(live), _shares(filed)
    agreement = {
        "median step live, file (ms)": (statistics.median(live.step_us) / 1e3, statistics.median(filed.step_us) / 1e3),
        "largest share difference, live against file (points)": 100 * max(abs(share - file_shares.get(c, 0.0))
                                                                           for c, share in live_shares.items()),
        "steps live, file": (live.steps, filed.steps),
    }
    medians = {k: statistics.median(v) for k, v in times.items()}
    log(f"\n{name}: {about}; {steps} steps, {events:,} kineto events, a {size / 2**20:.1f} MiB trace file")
    for what, seconds in medians.items():
        log(f"  {what:<14} {seconds:8.3f} s  {seconds / events * 1e6:6.1f} µs an event")
    log(f"  export + file summary / live columns: "
        f"{(medians['export'] + medians['file summary']) / medians['live columns']:.2f}x")
    for what, value in agreement.items():
        log(f"  {what}: {value}")
    return {"events": events, "bytes": size, "medians_s": medians, "agreement": agreement}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--reps", type=int, default=3, help="interleaved rounds (default 3)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(machine_line(), f"| torch {torch.__version__} | 1 intra-op thread")
    return {name: bench(name, args.reps) for name in args.workloads.split(",")}


if __name__ == "__main__":
    main()
