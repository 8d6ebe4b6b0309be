"""%autobatch on a real GPU: trials, answers run after run, and the truth from fresh processes.

    python benchmarks/gpu_autobatch.py OUT_DIR [--budget-gib 16] [--runs 3]
    python benchmarks/gpu_autobatch.py --steps "$(cat OUT_DIR/whole_gpu_answer.txt)"   # afterwards

A small transformer trained with AdamW. For a fixed budget (margin 0): the answer and the number of
real trials in each of ``--runs`` searches in this process, and the truth: the largest batch size whose
peak above the starting state (allocated, and reserved, the larger) stays under the budget, measured
by bisection with one fresh process per size (two steps each, so AdamW's state counts).  Then one
search with the whole GPU as budget, which runs out of memory on the way: its answer, the allocator's
reserved-but-unallocated bytes left after it (fragmentation), and its answer in
``whole_gpu_answer.txt`` for the second command: four training steps at that size in a process
started once this one has ended (per-step peaks, or the out-of-memory error).  Writes
``autobatch_gpu.json`` and prints one line per figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

GiB = 2**30
SEQ, WIDTH, LAYERS, VOCAB = 256, 512, 6, 8192


def build(device: str):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(WIDTH, 8, 4 * WIDTH, batch_first=True, dropout=0.0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False),
                          nn.Linear(WIDTH, VOCAB)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(bs: int):
        tokens = torch.randint(0, VOCAB, (bs, SEQ), device=device)
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt, step


def peak_in_fresh_process(bs: int, device: str) -> int | None:
    """The peak above the starting state of two steps at ``bs`` in a new process; None if it ran out."""
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); import torch\n"
            f"from benchmarks.gpu_autobatch import build\n"
            f"model, opt, step = build({device!r}); torch.cuda.synchronize()\n"
            f"a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()\n"
            f"torch.cuda.reset_peak_memory_stats()\n"
            f"try:\n    step({bs}); step({bs}); torch.cuda.synchronize()\n"
            f"except torch.OutOfMemoryError:\n    print('OOM'); raise SystemExit\n"
            f"print(max(torch.cuda.max_memory_allocated() - a0, torch.cuda.max_memory_reserved() - r0))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    last = (out.stdout.strip().splitlines() or ["?"])[-1]
    if last == "OOM":
        return None
    if out.returncode or not last.isdigit():
        raise RuntimeError(f"truth probe at {bs} failed: {out.stderr[-800:]}")
    return int(last)


def truth(limit: int, device: str, hint: int) -> tuple[int, int]:
    """The largest size peaking at or under ``limit`` (bisection from ``hint``) and how many processes it took."""
    probes = 0

    def fits(bs):
        nonlocal probes
        probes += 1
        peak = peak_in_fresh_process(bs, device)
        return peak is not None and peak <= limit
    lo, hi = max(1, int(hint * 0.95)), max(2, int(hint * 1.05) + 1)  # a bracket around the answer, widened
    while not fits(lo):                                                 # where it does not hold
        lo, hi = max(1, lo // 2), lo
        if lo == 1 and not fits(1):
            return 0, probes
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, probes


def summary(r) -> dict:
    real = [t for t in r.trials if not t.estimated]
    return {"batch_size": r.batch_size, "real_trials": len(real), "estimated": sum(t.estimated for t in r.trials),
            "seconds": round(r.seconds, 2), "limit_bytes": r.limit_bytes, "notes": r.notes,
            "trials": [(t.batch_size, t.peak_bytes, t.allocated_bytes, t.ran, t.ok, t.estimated, t.error)
                       for t in r.trials], "text": r.to_text()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--budget-gib", type=float, default=16.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-whole-gpu", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return 0
    import torchmagic
    os.makedirs(args.out, exist_ok=True)
    figures: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "model": f"transformer {LAYERS}x{WIDTH}, seq {SEQ}, vocab {VOCAB}, AdamW"}
    path = os.path.join(args.out, "autobatch_gpu.json")

    def save():
        with open(path, "w") as f:
            json.dump(figures, f, indent=1, default=str)

    model, opt, step = build("cuda")
    budget = int(args.budget_gib * GiB)
    runs = figures["fixed_budget"] = []
    for _ in range(args.runs):
        r = torchmagic.autobatch(step, budget=budget, margin=0.0, max=2**16)
        runs.append(summary(r))
        print(f"budget {args.budget_gib} GiB: answer {r.batch_size}, {runs[-1]['real_trials']} real trials, "
              f"{r.seconds:.1f} s")
        save()
    started = time.perf_counter()
    best, probes = truth(runs[0]["limit_bytes"], "cuda", runs[0]["batch_size"] or 1)
    figures["fixed_budget_truth"] = {"batch_size": best, "processes": probes,
                                     "seconds": round(time.perf_counter() - started, 1)}
    print(f"truth (fresh processes): {best} ({probes} processes); answers at "
          + ", ".join(f"{x['batch_size'] / best:.1%}" for x in runs))
    save()
    if not args.skip_whole_gpu:
        torch.cuda.empty_cache()
        r = torchmagic.autobatch(step, budget=1.0, margin=0.0, max=2**16)
        whole = figures["whole_gpu"] = summary(r)
        whole["reserved_unallocated_after"] = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        oom = [t for t in r.trials if not t.ran and not t.estimated]
        print(f"whole GPU: answer {r.batch_size}, {whole['real_trials']} real trials ({len(oom)} out of memory), "
              f"{r.seconds:.1f} s; reserved-unallocated after {whole['reserved_unallocated_after'] / GiB:.2f} GiB")
        save()
        # Whether training at that answer runs is for a process started after this one ends: while it
        # lives, its CUDA context and cache (922 MiB on the H200) are memory the search did not share.
        with open(os.path.join(args.out, "whole_gpu_answer.txt"), "w") as f:
            f.write(str(r.batch_size))
    return 0


def steps_profile(bs: int, steps: int = 4, warm_first: bool = False) -> list[tuple[int, int, int]]:
    """(allocated peak, reserved peak, reserved after) above the start, step by step, in this process;
    with ``warm_first``, as a search does: a step at size 1 first, then an empty cache."""
    model, opt, step = build("cuda")
    if warm_first:
        step(1)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    rows = []
    for _ in range(steps):
        torch.cuda.reset_peak_memory_stats()
        step(bs)
        torch.cuda.synchronize()
        rows.append((torch.cuda.max_memory_allocated() - a0, torch.cuda.max_memory_reserved() - r0,
                     torch.cuda.memory_reserved() - r0))
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--steps"]:  # one size's per-step peaks, in a process of its own
        print(json.dumps(steps_profile(int(sys.argv[2]), warm_first=len(sys.argv) > 3)))
    else:
        sys.exit(main())
