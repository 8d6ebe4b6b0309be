"""The README's example, measured: profile the cell, then check its `amp` finding by timing
fp32 against bf16 autocast on the same training epoch.

    python -m benchmarks.readme_example

Prints the findings, the fp32 and autocast medians over interleaved runs (A B A B ...), and
the speedup (the median of per-round ratios) with its 95% confidence interval.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from benchmarks.machine import machine_line
import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.core.measure import paired_ratio
from torchmagic.features.compare.view import speed_words


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(128, 512), torch.randint(0, 10, (128,))) for _ in range(10)]

    def epoch(amp: bool = False):
        for x, y in data:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()

    return epoch


def main(rounds: int = 15) -> dict:
    epoch = build()
    result = torchmagic.profile(epoch, warmup=1, steps=3, label="README example")
    print(f"{result.label}: median step {result.median_step_s * 1e3:.1f} ms")
    for f in result.findings:
        print(f"  [{f.severity}] {f.rule}: {f.title}")
    epoch(False), epoch(True)  # warm both paths
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for amp in (False, True):
            start = time.perf_counter()
            epoch(amp)
            times[amp].append(time.perf_counter() - start)
    fp32, bf16 = statistics.median(times[False]), statistics.median(times[True])
    ratio = paired_ratio(times[False], times[True])
    (low, high), speedup = ratio.ci, ratio.estimate
    print(f"fp32 epoch {fp32 * 1e3:.1f} ms, bf16 autocast epoch {bf16 * 1e3:.1f} ms: "
          f"bf16 {speed_words(speedup)} (speedup {speedup:.2f}, 95% CI {low:.2f}-{high:.2f}, "
          f"{rounds} interleaved rounds; {CpuDevice().low_precision().reason})")
    print(machine_line())
    return {"findings": [f.rule for f in result.findings], "fp32_s": fp32, "bf16_s": bf16,
            "speedup": speedup, "ci": (low, high)}


if __name__ == "__main__":
    main()
