"""Memory growth per run: each magic and ``analyze`` run again and again in one real IPython shell.

    python -m benchmarks.growth [--runs 50] [--warmup 10] [--only NAME,...] [--tracemalloc]

Each workload runs ``--warmup`` times (imports, caches, the allocator's first pools), then
``--runs`` times; the figure is the process's resident memory (VmRSS) after the runs minus before,
with a full collection before each reading: raw, and after glibc's malloc_trim hands the free heap
back to the OS (what the process still holds; glibc keeps freed pages of matplotlib's render buffers
in a fragmented heap, up to ~20 MiB over the first hundred renders, then flat).  The bound is on the
trimmed figure.  The result is kept in a variable the next run rebinds
(``-o r`` or ``r = ...``) and no cell stores output history: what the user keeps is theirs.  With
``--tracemalloc`` the growth of Python's traced allocations is read too (it slows every run 2-3x and
its own bookkeeping is resident, so the RSS figure is then not comparable).  A workload is marked
OVER when it grew by more than 1 MiB per 50 runs; the script exits 1 if any did.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path

from benchmarks.machine import machine_line
from torchmagic.core.devices import CpuDevice

TRACE = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces" / "hta_cpu_gloo_rank-34.json.gz"
BOUND_MIB_PER_50 = 1.0

SETUP = f"""
import torch, torchmagic
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
x = torch.randn(32, 64)
def step(bs):
    model(torch.randn(bs, 64)).sum().backward()
class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.full((16,), float(i))
items = Items()
TRACE = {str(TRACE)!r}
"""

# name -> the cell run each time
WORKLOADS = {
    "%%torchprofile": "%%torchprofile -q -o r\nmodel(x).sum().backward()",
    "%gpumem": "r = %gpumem",
    "%%gpumem": "%%gpumem -q -o r\ny = model(x)",
    "%%amp_compare": "%%amp_compare --variants eager,amp --runs 3 --min-time 0.01 --warmup 1 -q -o r\nmodel(x)",
    "%autobatch": "%autobatch --max 64 --budget 64MiB -q -o r step",
    "%loadertune": "%loadertune items batch_size=8 --workers 0,1 --batches 2 --rounds 2 -q -o r",
    "analyze": "r = torchmagic.analyze(TRACE)\ndisplay(r)",
}


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def trimmed_resident_bytes() -> int:
    CpuDevice().empty_cache()  # malloc_trim(0)
    return resident_bytes()


def measure(shell, cell: str, runs: int, warmup: int, traced: bool) -> tuple[float, float, float, float | None]:
    """(seconds per run, resident growth and trimmed resident growth in MiB, traced growth in MiB or None)."""
    from IPython.utils.capture import capture_output

    def run_once():
        with capture_output():
            result = shell.run_cell(cell, store_history=False)
        if not result.success:
            raise RuntimeError(f"{cell!r} failed: {result.error_before_exec or result.error_in_exec!r}")

    for _ in range(warmup):
        run_once()
    gc.collect()
    rss, traced_before = resident_bytes(), tracemalloc.get_traced_memory()[0] if traced else None
    trimmed = trimmed_resident_bytes()
    start = time.perf_counter()
    for _ in range(runs):
        run_once()
    seconds = (time.perf_counter() - start) / runs
    gc.collect()
    grown = (resident_bytes() - rss) / 2**20
    grown_trimmed = (trimmed_resident_bytes() - trimmed) / 2**20
    traced_grown = (tracemalloc.get_traced_memory()[0] - traced_before) / 2**20 if traced else None
    return seconds, grown, grown_trimmed, traced_grown


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--only", help="comma-separated workload names")
    parser.add_argument("--tracemalloc", action="store_true")
    args = parser.parse_args()
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "torchmagic")
    shell.run_cell(SETUP + "\ntorch.set_num_threads(1)")
    if args.tracemalloc:
        tracemalloc.start()
    print(machine_line())
    print(f"{args.warmup} warm-up runs, then {args.runs}; growth scaled to 50 runs; bound {BOUND_MIB_PER_50} MiB")
    over = []
    names = args.only.split(",") if args.only else list(WORKLOADS)
    for name in names:
        seconds, grown, grown_trimmed, traced = measure(shell, WORKLOADS[name], args.runs, args.warmup,
                                                        args.tracemalloc)
        per_50, trimmed_per_50 = grown * 50 / args.runs, grown_trimmed * 50 / args.runs
        flag = "ok" if trimmed_per_50 <= BOUND_MIB_PER_50 else "OVER"
        if flag == "OVER":
            over.append(name)
        extra = f", traced {traced * 50 / args.runs:+.2f} MiB" if traced is not None else ""
        print(f"{name:16s} {seconds * 1e3:8.1f} ms/run   per 50 runs: resident {per_50:+6.2f} MiB, "
              f"trimmed {trimmed_per_50:+6.2f} MiB{extra}   {flag}", flush=True)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
