"""The speedups the tutorials measure, side by side in one run, each with its 95% CI.

    python -m benchmarks.tutorial_speedups

Each technique is timed with ``torchmagic.compare`` (interleaved rounds against eager fp32 on the
same workload; the speedup is the median per-round ratio, with its 95% CI), on the kind of workload
its tutorial uses:

* bf16 autocast: an MLP training step (04_mixed_precision);
* torch.compile: a chain of 21 pointwise ops on a small tensor (05_torch_compile, 10_launch_overhead),
  its compile time and break-even beside it;
* inference_mode: an MLP forward under grad mode vs inference_mode (06_inference);
* dynamic int8: an MLP forward, quantize_dynamic of its Linear layers (07_quantization_and_pruning);
* batched logging: a 20-step training loop reading the loss with .item() every step vs every 10th
  (09_syncs_and_timing).

One torch thread and malloc's trim and mmap thresholds pinned, as in compare_accuracy.py: on a
shared 2-core machine two threads, or a heap that changes state, make any timer noisy.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

import torchmagic
from torchmagic import Technique, Variant
from torchmagic.core.render.format import fmt_s

from benchmarks.compare_accuracy import pin_malloc_thresholds
from benchmarks.machine import machine_line

MIN_TIME = 1.5  # seconds of timed runs per variant


def mlp(width: int = 512) -> nn.Module:
    return nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def autocast_training():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(128, 512), torch.randint(0, 10, (128,))

    def step(m):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return torchmagic.compare(step, model=model, variants="eager,amp", min_time=MIN_TIME, restore=[model, opt],
                              label="bf16 autocast, MLP training step"), "amp"


class PointwiseChain(nn.Module):
    def forward(self, x):
        for _ in range(7):
            x = torch.relu(x * 1.01 + 0.1)
        return x


def compile_pointwise():
    model, x = PointwiseChain(), torch.randn(256)
    return torchmagic.compare(lambda m: m(x), model=model, variants="eager,compile", min_time=MIN_TIME,
                              label="torch.compile, 21 pointwise ops on 256 elements"), "compile"


def inference_mode_forward():
    model, x = mlp(), torch.randn(64, 512)
    return torchmagic.compare(lambda m: m(x), model=model, variants="eager,inference_mode", min_time=MIN_TIME,
                              label="inference_mode, MLP forward"), "inference_mode"


def int8_forward():
    model, x = mlp().eval(), torch.randn(64, 512)
    with torch.no_grad():
        return torchmagic.compare(lambda m: m(x), model=model, variants="eager,int8", min_time=MIN_TIME,
                                  label="dynamic int8, MLP forward"), "int8"


LOG_EVERY = {"steps": 1}


def batched_logging():
    model = mlp(256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(32, 256), torch.randint(0, 10, (32,))) for _ in range(20)]

    def loop(m):
        logged = []
        for i, (x, y) in enumerate(batches):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            if i % LOG_EVERY["steps"] == 0:
                logged.append(loss.item())  # a host read: on a GPU, a full stall each
        return torch.tensor(logged[:1])

    @contextlib.contextmanager
    def every_tenth(model, env):
        LOG_EVERY["steps"] = 10
        try:
            yield
        finally:
            LOG_EVERY["steps"] = 1

    variant = Variant("log every 10", (Technique("log every 10", around_call=every_tenth),))
    return torchmagic.compare(loop, model=model, variants=["eager", variant], min_time=MIN_TIME,
                              restore=[model, opt], label="batched logging, 20-step loop"), "log every 10"


CASES = [autocast_training, compile_pointwise, inference_mode_forward, int8_forward, batched_logging]


def main() -> list[dict]:
    torch.set_num_threads(1)
    pinned = pin_malloc_thresholds()
    print(machine_line() + f"; 1 torch thread; malloc thresholds {'pinned' if pinned else 'not pinned'}")
    print(f"each: torchmagic.compare, interleaved rounds, >= {MIN_TIME:g} s timed per variant; speedup: the median "
          "per-round ratio, 95% CI from its order statistics\n")
    rows = []
    for case in CASES:
        start = time.perf_counter()
        result, name = case()
        v = result[name]
        rows.append({"case": result.label, "variant": name, "speedup": v.speedup, "ci": v.ci,
                     "compile_s": v.compile_s, "break_even": v.break_even_runs, "max_rel_err": v.max_rel_err,
                     "seconds": time.perf_counter() - start})
    print(f"{'workload':50s} {'speedup':>8s} {'95% CI':>13s} {'max rel err':>11s}  notes")
    for r in rows:
        ci = f"{r['ci'][0]:.2f}–{r['ci'][1]:.2f}" if r["ci"] else "–"
        err = f"{r['max_rel_err']:.1e}" if r["max_rel_err"] is not None else "–"
        notes = []
        if r["compile_s"]:  # compile, or quantize: the one-time cost before the first fast run
            notes.append(f"one-time cost {fmt_s(r['compile_s'])}")
        if r["break_even"]:
            notes.append(f"pays off after {r['break_even']:,} runs")
        print(f"{r['case']:50s} {r['speedup']:7.2f}× {ci:>13s} {err:>11s}  {', '.join(notes)}")
    print(f"\n{len(rows)} comparisons in {sum(r['seconds'] for r in rows):.0f} s")
    return rows


if __name__ == "__main__":
    main()
