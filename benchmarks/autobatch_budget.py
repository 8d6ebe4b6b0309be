"""%autobatch: real runs to an answer on known memory laws, and whether the process stays in its budget.

    python -m benchmarks.autobatch_budget

1. Memory laws (linear, quadratic, concave, noisy, 20 MiB allocator blocks, blocks of 128 samples,
   a CPU-style floor) on a simulated 16 GiB device: how many real runs the search needs before one
   fits within 5% of the true answer, and in all, with fake-tensor estimates (which see the law's
   shape without using memory) and with real runs only.
2. Two models made in code, trained on the CPU with a 256 MiB budget (limit 230 MiB after the
   default 10% margin): the answer, then the process's resident-memory growth running the step at
   that answer (the most of three runs), against the budget.  Beside it, the answer a search on
   torch's allocations alone would give (what %autobatch did before it read the process's
   footprint) and the growth at that answer.
3. The issue's "done when", on the residual CNN with AdamW and the transformer with AdamW, under
   `%autobatch step --budget 256MiB --margin 0`: five runs per model, each on a fresh model built
   from seed 0; the truth is the largest batch size whose two steps from a freshly built model, in
   new Python processes, peak at or under the limit (the larger of torch's allocations and the
   process's exact resident growth, VmHWM after clear_refs, the most of three processes: it varies),
   found by bisection around the median answer.  Verdicts: at most 4 real trials; every answer
   within 5% of the truth and never above it; the five answers within 3% of each other.
   With --fresh, the searches are `%%autobatch --fresh step` (each read of a trial in a process
   started for it, as the truth is read): real trials only, no estimates.

    python -m benchmarks.autobatch_budget --sections 3 [--fresh]
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

import torchmagic
from benchmarks.machine import machine_line
from torchmagic.core.devices import CpuDevice
from torchmagic.core.devices.profiler import allocation_peak
from torchmagic.features.autobatch.search import Probe, SearchSpace, search

MiB, GiB = 2**20, 2**30


# -- 1. laws --------------------------------------------------------------------------------
LAWS = {
    "linear": lambda bs: 500 * MiB + 3 * MiB * bs,
    "quadratic": lambda bs: 200 * MiB + 1 * MiB * bs + int(0.002 * MiB * bs * bs),
    "concave": lambda bs: 300 * MiB + int(8 * MiB * bs ** 0.8),
    "noisy (±3%)": lambda bs: int((500 * MiB + 3 * MiB * bs) * (1 + 0.03 * math.sin(bs * 12.9898))),
    "20 MiB blocks": lambda bs: math.ceil((500 * MiB + 3 * MiB * bs) / (20 * MiB)) * 20 * MiB,
    "128-sample blocks": lambda bs: 400 * MiB + math.ceil(bs / 128) * 128 * 3 * MiB,
    "CPU floor": lambda bs: max(64 * MiB, 300 * 1024 * bs),
}
CAPACITY, LIMIT = 16 * GiB, int(0.9 * 16 * GiB)


def law_row(name: str, law, estimates: bool) -> str:
    def run(bs):
        need = law(bs)
        return Probe(bs, need, True) if need <= CAPACITY else Probe(bs, None, False, error="out of memory")

    space = SearchSpace(1, 100_000, 1)
    estimate = (lambda bs: Probe(bs, law(bs), True, estimated=True)) if estimates else None
    out = search(run, LIMIT, space, estimate)
    truth = max(bs for bs in range(1, 100_001) if law(bs) <= LIMIT)
    real = [p for p in out.probes if not p.estimated]
    landed = next(i + 1 for i, p in enumerate(real) if p.ran and p.peak_bytes <= LIMIT and p.batch_size >= 0.95 * truth)
    return (f"  {name:18s} {'estimates' if estimates else 'real only':9s} true {truth:6d}  answer {out.batch_size:6d}  "
            f"within 5% after {landed:2d} real runs, {len(real):2d} in all, {len(out.probes) - len(real):2d} estimates")


# -- 2. models ------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                                  nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels))

    def forward(self, x):
        return torch.relu(x + self.body(x))


def residual_cnn() -> nn.Module:
    """The residual CNN of resnet_step, built from seed 0 (a fresh process builds the same one)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), Block(32), Block(32),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def cnn_step(model: nn.Module, opt):
    def step(bs):
        loss = nn.functional.cross_entropy(model(torch.randn(bs, 3, 32, 32)), torch.randint(0, 10, (bs,)))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def resnet_step():
    """A small residual CNN on 32x32 images, SGD with momentum: runs on fake tensors (estimates)."""
    model = residual_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return cnn_step(model, opt)


def resnet_adamw_step():
    """The residual CNN of resnet_step with AdamW: its moments are optimizer state the first step creates."""
    model = residual_cnn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return cnn_step(model, opt)


def transformer_step():
    """Four transformer encoder layers over 64 tokens, AdamW (estimated from the user's state, where
    its moments do not exist yet).  Built from seed 0."""
    torch.manual_seed(0)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(128, 4, 512, batch_first=True), 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(bs):
        loss = model(torch.randn(bs, 64, 128)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


class AllocationsOnlyCpu(CpuDevice):
    """The CPU as %autobatch measured it before: torch's allocations only."""

    def peak_scope(self):
        return allocation_peak(torch.autograd.DeviceType.CPU)

    def footprint_scope(self):
        return None


def growth_at(step, size: int, runs: int = 3) -> int:
    """The most the process's resident memory grew running ``step(size)``."""
    device, most = CpuDevice(), 0
    for _ in range(runs):
        device.empty_cache()
        with device.footprint_scope() as reading:
            step(size)
        most = max(most, reading.footprint_bytes or 0)
    return most


def model_row(name: str, make, budget: int) -> list[str]:
    lines = []
    for label, device in (("process (now)", CpuDevice()), ("allocations only", AllocationsOnlyCpu())):
        step = make()
        started = time.perf_counter()
        r = torchmagic.autobatch(step, budget=budget, multiple_of=8, device=device)
        seconds = time.perf_counter() - started
        real = sum(not t.estimated for t in r.trials)
        grew = growth_at(step, r.batch_size)
        lines.append(f"  {name:12s} {label:16s} answer {r.batch_size:5d} ({real:2d} real runs, "
                     f"{len(r.trials) - real:2d} estimates, {seconds:5.1f} s); the process grew {grew / MiB:6.1f} MiB "
                     f"= {grew / budget:4.0%} of the budget")
    return lines


# -- 3. the "done when" ---------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
RUNS = 5

# In a new process: build the model with the factory, run two steps at the size (the first creates
# the optimizer state, the second runs among it), print the peak above the start in bytes.
FRESH = """
import gc, os, sys
import torch
import benchmarks.autobatch_budget as bench
factory, size, reading = sys.argv[1], int(sys.argv[2]), sys.argv[3]
step = getattr(bench, factory)()
if reading == "allocations":
    from torchmagic.core.devices.profiler import allocation_peak
    with allocation_peak(torch.autograd.DeviceType.CPU) as r:
        step(size)
        step(size)
    peak = r.peak_bytes
else:
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    step(size)
    step(size)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    peak = hwm - before
print("PEAK", peak)
"""


# A fresh process's resident growth over the same two steps is not repeatable where tensors live in
# glibc's heap (the CNN at 95: 259-318 MiB in 5 processes): a size fits only if it fits in each of these.
FRESH_RESIDENT_READS = 3


class FreshPeaks:
    """Each size's peak in fresh processes: the larger of torch's allocations and the most resident
    growth, each read in a process of its own; kept by size, so a size runs once."""

    def __init__(self, factory, limit: int):
        self.factory, self.limit, self.readings, self.processes = factory.__name__, limit, {}, 0

    def _read(self, size: int, reading: str) -> int:
        done = subprocess.run([sys.executable, "-c", FRESH, self.factory, str(size), reading], cwd=ROOT,
                              capture_output=True, text=True, check=False)
        self.processes += 1
        lines = [line for line in done.stdout.splitlines() if line.startswith("PEAK ")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"fresh process ({self.factory}, {size}, {reading}) failed:\n{done.stderr[-2000:]}")
        return int(lines[-1].split()[1])

    def __call__(self, size: int) -> int:
        if size not in self.readings:
            allocated = self._read(size, "allocations")
            grew = [self._read(size, "resident") for _ in range(FRESH_RESIDENT_READS)]
            self.readings[size] = (allocated, *grew)
            peak = max(allocated, *grew)
            print(f"      size {size:5d}: allocations {allocated / MiB:6.1f} MiB, resident growth "
                  f"{min(grew) / MiB:6.1f}-{max(grew) / MiB:6.1f} MiB in {len(grew)} processes"
                  f" -> {peak / MiB:6.1f} MiB {'fits' if peak <= self.limit else 'over'}", flush=True)
        return max(self.readings[size])

    def fits(self, size: int) -> bool:
        return self(size) <= self.limit


def fresh_truth(peaks: FreshPeaks, around: float) -> int:
    """The largest size that fits in fresh processes: a bracket around ``around``, widened until its
    low end fits and its high end does not, then bisected to neighbours."""
    low, high = max(1, math.floor(0.9 * around)), max(2, math.ceil(1.1 * around))
    while not peaks.fits(low):
        if low == 1:
            return 0
        high, low = low, max(1, math.floor(0.8 * low))
    while peaks.fits(high):
        low, high = high, math.ceil(1.25 * high)
    while high - low > 1:
        middle = (low + high) // 2
        if peaks.fits(middle):
            low = middle
        else:
            high = middle
    return low


def search_once(make, budget: int, fresh: bool):
    """One search as the user runs it: in this process on a fresh model, or with --fresh, each read
    in a process started for it (the cell builds the model there, as the truth's processes do)."""
    if not fresh:
        return torchmagic.autobatch(make(), budget=budget, margin=0.0, device=CpuDevice())
    code = f"from benchmarks.autobatch_budget import {make.__name__}\nstep = {make.__name__}()\n"
    return torchmagic.autobatch_ranks(code, 1, budget=budget, margin=0.0, fresh=True)


def done_when(name: str, make, budget: int, fresh: bool = False) -> list[str]:
    runs = []
    for i in range(RUNS):
        started = time.perf_counter()
        r = search_once(make, budget, fresh)
        seconds = time.perf_counter() - started
        real = sum(not t.estimated for t in r.trials)
        own = [t.peak_bytes for t in r.trials
               if t.batch_size == r.batch_size and not t.estimated and t.peak_bytes is not None]
        runs.append((r.batch_size, real, len(r.trials) - real, seconds, r.limit_bytes, max(own) if own else None))
        print(f"    run {i + 1}: answer {r.batch_size}, {real} real trials, {len(r.trials) - real} estimates, "
              f"{seconds:5.1f} s, limit {r.limit_bytes / MiB:.1f} MiB, its trial's peak "
              f"{max(own) / MiB if own else float('nan'):.1f} MiB", flush=True)
    limit = runs[0][4]
    answers = [run[0] for run in runs]
    print(f"    the truth in fresh processes (limit {limit} B = {limit / MiB:.1f} MiB of run 1), "
          f"bisected around the median {statistics.median(answers)}:", flush=True)
    peaks = FreshPeaks(make, limit)
    started = time.perf_counter()
    truth = fresh_truth(peaks, statistics.median(answers))
    for answer in sorted(set(answers)):
        peaks(answer)
    seconds = time.perf_counter() - started
    most_real = max(run[1] for run in runs)
    spread = max(answers) / min(answers) - 1
    shares = [a / truth for a in answers]
    within = all(abs(share - 1) <= 0.05 and a <= truth for share, a in zip(shares, answers))
    lines = [
        f"  {name}: answers {', '.join(map(str, answers))}; at most {most_real} real trials; "
        f"spread {spread:.1%}; truth {truth} ({peaks.processes} fresh processes, {seconds:.0f} s)",
        "    answers as % of the truth: " + ", ".join(f"{share:.1%}" for share in shares),
        f"    <= 4 real trials: {'PASS' if most_real <= 4 else 'FAIL'} (at most {most_real})",
        f"    within 5% of the truth, never above: {'PASS' if within else 'FAIL'} "
        f"({min(shares):.1%}-{max(shares):.1%})",
        f"    spread <= 3%: {'PASS' if spread <= 0.03 else 'FAIL'} ({spread:.1%})",
    ]
    fit = {size: max(reading) <= limit for size, reading in peaks.readings.items()}
    above, below = sorted(b for b, ok in fit.items() if ok and b > truth), sorted(b for b, ok in fit.items()
                                                                                  if not ok and b < truth)
    if above or below:
        lines.append(f"    not monotonic in fresh processes: fit above the truth {above or '-'}, over below it "
                     f"{below or '-'}; the largest size read that fits: {max(b for b, ok in fit.items() if ok)}")
    for i, (answer, *_, own) in enumerate(runs):
        fresh = peaks(answer)
        trial = "no trial at the answer" if own is None else \
            f"its trial peaked {own / MiB:6.1f} MiB ({'<=' if own <= limit else '>'} limit {limit / MiB:.1f})"
        lines.append(f"    run {i + 1} at {answer}: {trial}; fresh processes "
                     f"{fresh / MiB:6.1f} MiB ({'<=' if fresh <= limit else '>'} limit)")
    return lines


def main(sections=(1, 2, 3), fresh: bool = False) -> None:
    print(machine_line())
    if 1 in sections:
        section_1()
    if 2 in sections:
        section_2()
    if 3 in sections:
        section_3(fresh)


def section_3(fresh: bool = False) -> None:
    budget = 256 * MiB
    how = "%%autobatch --fresh step" if fresh else "%autobatch step"
    print(f"\n3. Done when: CPU, {how} --budget {budget / MiB:.0f}MiB --margin 0, {RUNS} runs per model; "
          "the truth from two steps of a fresh model in fresh processes", flush=True)
    for name, make in (("residual CNN + AdamW", resnet_adamw_step), ("transformer + AdamW", transformer_step)):
        print(f"  {name}:", flush=True)
        for line in done_when(name, make, budget, fresh):
            print(line, flush=True)


def section_1() -> None:
    print(f"\n1. Real runs to an answer within 5% of the truth: simulated {CAPACITY / GiB:.0f} GiB device, "
          f"limit {LIMIT / GiB:.1f} GiB, sizes 1-100000")
    for estimates in (True, False):
        for name, law in LAWS.items():
            print(law_row(name, law, estimates))


def section_2() -> None:
    budget = 256 * MiB
    torch.manual_seed(0)
    print(f"\n2. CPU, budget {budget / MiB:.0f} MiB (limit {0.9 * budget / MiB:.0f} MiB): the process's growth at the answer")
    for name, make in (("residual CNN", resnet_step), ("transformer", transformer_step)):
        for line in model_row(name, make, budget):
            print(line)


def parse_sections(text: str) -> tuple[int, ...]:
    sections = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    if not sections or not set(sections) <= {1, 2, 3}:
        raise argparse.ArgumentTypeError(f"sections are 1, 2 and 3, comma-separated: not {text!r}")
    return sections


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", "--section", type=parse_sections, default=(1, 2, 3),
                        help="which sections to run, comma-separated (default 1,2,3)")
    parser.add_argument("--fresh", action="store_true", help="section 3 searches with --fresh")
    arguments = parser.parse_args()
    main(arguments.sections, arguments.fresh)
