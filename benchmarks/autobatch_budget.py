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
"""

from __future__ import annotations

import math
import time

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


def resnet_step():
    """A small residual CNN on 32x32 images, SGD with momentum: runs on fake tensors (estimates)."""
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), Block(32), Block(32),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(bs):
        loss = nn.functional.cross_entropy(model(torch.randn(bs, 3, 32, 32)), torch.randint(0, 10, (bs,)))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def transformer_step():
    """Four transformer encoder layers over 64 tokens, AdamW: Adam reads its step count on the
    host, so no fake-tensor estimates; real runs only."""
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


def main() -> None:
    print(machine_line())
    print(f"\n1. Real runs to an answer within 5% of the truth: simulated {CAPACITY / GiB:.0f} GiB device, "
          f"limit {LIMIT / GiB:.1f} GiB, sizes 1-100000")
    for estimates in (True, False):
        for name, law in LAWS.items():
            print(law_row(name, law, estimates))
    budget = 256 * MiB
    torch.manual_seed(0)
    print(f"\n2. CPU, budget {budget / MiB:.0f} MiB (limit {0.9 * budget / MiB:.0f} MiB): the process's growth at the answer")
    for name, make in (("residual CNN", resnet_step), ("transformer", transformer_step)):
        for line in model_row(name, make, budget):
            print(line)


if __name__ == "__main__":
    main()
