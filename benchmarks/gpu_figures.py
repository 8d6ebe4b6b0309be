"""What each magic reports on a real CUDA GPU, for a 4096-wide MLP, with torch's own readings beside.

    python benchmarks/gpu_figures.py        # needs CUDA; prints "no CUDA device" and exits 0 without

Four figures, each torchmagic's reading next to an independent one taken the same way by hand:

1. ``torchmagic.compare`` of eager, bf16 autocast, ``torch.compile`` and ``compile:reduce-overhead``
   (CUDA graphs) on a 3-layer 4096-wide MLP forward at batch 4096, beside CUDA-event timings of
   eager and autocast (100 calls after 10 warm-up calls);
2. ``torchmagic.profile`` of an SGD training step: kernel time of the GEMMs against all kernel time,
   and the findings;
3. ``torchmagic.autobatch`` of an Adam training step with a 4 GiB budget against the allocator's
   peak for the answer and for twice the answer;
4. ``torchmagic.memory`` of a 1 GiB tensor: allocator and NVML readings.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torchmagic  # noqa: E402
from benchmarks.machine import machine_line  # noqa: E402

WIDE, BATCH = 4096, 4096
GiB = 2**30


def mlp():
    return nn.Sequential(nn.Linear(WIDE, WIDE), nn.ReLU(), nn.Linear(WIDE, WIDE), nn.ReLU(),
                         nn.Linear(WIDE, WIDE)).cuda()


def event_seconds(fn, calls=100):
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / calls


def compare_figures():
    model = mlp().eval()
    x = torch.randn(BATCH, WIDE, device="cuda")
    with torch.no_grad():
        r = torchmagic.compare(lambda m: m(x), model=model, variants="eager,amp,compile,compile:reduce-overhead",
                               runs=10, min_time=0.2)
        eager_s = event_seconds(lambda: model(x))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            amp_s = event_seconds(lambda: model(x))
    print(r.to_text())
    print(f"CUDA events, same calls: eager {eager_s * 1e3:.3f} ms, bf16 autocast {amp_s * 1e3:.3f} ms "
          f"({eager_s / amp_s:.2f}x); torchmagic medians: eager {r['eager'].median_s * 1e3:.3f} ms, "
          f"amp {r['amp'].median_s * 1e3:.3f} ms")


def profile_figures():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, WIDE, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    r = torchmagic.profile(step, steps=5, warmup=2)
    kernel_us = sum(op.self_device_us for op in r.ops)
    gemm_us = sum(op.self_device_us for op in r.ops if op.name in ("aten::mm", "aten::addmm"))
    print(r.to_text())
    print(f"GEMM kernels: {gemm_us / 1e3:.2f} ms of {kernel_us / 1e3:.2f} ms kernel time "
          f"({gemm_us / max(kernel_us, 1e-9):.0%}) over {len(r.step_s)} steps")


def autobatch_figures():
    model = nn.Sequential(nn.Linear(WIDE, WIDE), nn.ReLU(), nn.Linear(WIDE, WIDE)).cuda()
    opt = torch.optim.Adam(model.parameters())

    def step(bs):
        opt.zero_grad(set_to_none=True)
        model(torch.randn(bs, WIDE, device="cuda")).square().mean().backward()
        opt.step()

    budget = 4 * GiB
    r = torchmagic.autobatch(step, budget=budget, margin=0.0, max=2**20)
    print(r.to_text())

    def peak(bs):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        try:
            step(bs)
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - base
        except torch.OutOfMemoryError:
            return None
        finally:
            opt.state.clear()
            opt.zero_grad(set_to_none=True)

    if r.batch_size:
        for bs in (r.batch_size, 2 * r.batch_size):
            p = peak(bs)
            print(f"allocator peak at batch {bs}: {p / GiB:.3f} GiB of a {budget / GiB:.0f} GiB budget"
                  if p is not None else f"batch {bs}: out of memory")


def memory_figures():
    held = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    r = torchmagic.memory({"held": held})
    print(r.to_text())
    print(f"torch.cuda.memory_allocated: {torch.cuda.memory_allocated() / GiB:.3f} GiB, "
          f"memory_reserved: {torch.cuda.memory_reserved() / GiB:.3f} GiB")


def main():
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 0
    print(machine_line())
    for figures in (compare_figures, profile_figures, autobatch_figures, memory_figures):
        print(f"\n## {figures.__name__.replace('_figures', '')}")
        figures()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
