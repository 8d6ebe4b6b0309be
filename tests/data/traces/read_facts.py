"""The facts of each trace here, read from its events with plain json and nothing of torchmagic's.

Run `python tests/data/traces/read_facts.py` to print them; README.md holds the table they fill, and
tests/profile/traces/test_real_traces.py asserts torchmagic's reports against that table.  What each is:

- steps, step_ms: the ProfilerStep#N ranges (torch 1.8-1.9 wrote them as category "Operator"); a trace
  without them is one window from its first event to its last
- gpu_launched_ms: per step, the union of the compute kernels, copies and memsets whose runtime call
  (same "correlation") was made inside the step, wherever they ran
- gpu_in_window: the union of those device events clipped to the steps, as a share of the steps
- loading / loading_exposed: enumerate(DataLoader) ranges in the steps, as a share; exposed: with no
  device work running beside them
- comm_ms: the union of NCCL kernels in the steps, per step, and which collectives they were
- gpu_idle: the share of the steps in which no device work they launched ran (compute or NCCL)
- d2h_host_ms, d2h_per_step: per step, host time in runtime calls whose copy is device-to-host (the host
  waiting), and how many
"""

import bisect
import glob
import gzip
import json
import os
from collections import Counter, defaultdict

EARLIER = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy",
           "Memset": "gpu_memset"}
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(intervals):
    return sum(b - a for a, b in intervals)


def clip(intervals, start, end):
    return [(max(a, start), min(b, end)) for a, b in intervals if min(b, end) > max(a, start)]


def minus(a, b):
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def facts(path):
    with (gzip.open(path) if path.endswith(".gz") else open(path)) as f:
        data = json.load(f)
    events = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    cat = lambda e: EARLIER.get(e.get("cat"), e.get("cat"))
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if str(e.get("name", "")).startswith("ProfilerStep#") and cat(e) in ("user_annotation", "cpu_op"))
    marked = bool(steps)
    if not steps:
        steps = [(min(e["ts"] for e in events), max(e["ts"] + e.get("dur", 0) for e in events))]
    total, n = sum(b - a for a, b in steps), len(steps)
    device = [e for e in events if cat(e) in DEVICE]
    nccl = [e for e in device if e["name"].startswith(("ncclKernel", "ncclDevKernel"))]
    compute = [e for e in device if not e["name"].startswith(("ncclKernel", "ncclDevKernel"))]
    runtime = [e for e in events if cat(e) in ("cuda_runtime", "cuda_driver")]
    starts = [a for a, _ in steps]
    step_of_launch = {}
    for e in runtime:
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i >= 0 and e["ts"] < steps[i][1]:
            step_of_launch[e.get("args", {}).get("correlation")] = i
    launched, launched_all = defaultdict(list), defaultdict(list)
    for e in device:
        i = step_of_launch.get(e.get("args", {}).get("correlation"))
        if i is not None:
            launched_all[i].append((e["ts"], e["ts"] + e["dur"]))
            if e in compute:
                launched[i].append((e["ts"], e["ts"] + e["dur"]))
    busy = union((e["ts"], e["ts"] + e["dur"]) for e in device)
    busy_compute = union((e["ts"], e["ts"] + e["dur"]) for e in compute)
    loading = union((e["ts"], e["ts"] + e["dur"]) for e in events
                    if str(e.get("name", "")).startswith("enumerate(DataLoader)"))
    loading_in = [iv for s, t in steps for iv in clip(loading, s, t)]
    comm = union((e["ts"], e["ts"] + e["dur"]) for e in nccl)
    d2h = {e.get("args", {}).get("correlation") for e in device if "DtoH" in e["name"]}
    d2h_calls = [e for e in runtime if e.get("args", {}).get("correlation") in d2h and any(s <= e["ts"] < t for s, t in steps)]
    d2h_host = sum(e["dur"] for e in d2h_calls)
    busy_launched = sum(length(union(v)) for v in launched_all.values())
    return {
        "schema": "torch 1.8-1.9" if any(e.get("cat") == "Operator" for e in events) else "torch 1.10+",
        "steps": n if marked else 0,
        "step_ms": round(total / n / 1e3, 2),
        "gpu_launched_ms": round(sum(length(union(v)) for v in launched.values()) / n / 1e3, 2),
        "gpu_in_window": round(sum(length(clip(busy_compute, s, t)) for s, t in steps) / total, 3),
        "loading": round(length(loading_in) / total, 3),
        "loading_exposed": round(length(minus(loading_in, busy)) / total, 3),
        "comm_ms": round(sum(length(clip(comm, s, t)) for s, t in steps) / n / 1e3, 2),
        "collectives": dict(Counter(e["name"].split("_")[1] for e in nccl)),
        "gpu_idle": round(max(1 - busy_launched / total, 0.0), 3) if device else None,
        "d2h_host_ms": round(d2h_host / n / 1e3, 2),
        "d2h_per_step": round(len(d2h_calls) / n, 2),
        "categories": dict(Counter(e.get("cat") for e in events).most_common(6)),
    }


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(here, "**", "*.json.gz"), recursive=True)):
        print(os.path.relpath(path, here), json.dumps(facts(path)))
