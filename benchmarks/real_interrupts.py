"""Real Ctrl-Cs: SIGINT sent to the process by a timer at a random moment of each magic's run, on two
workloads no test uses (a BatchNorm CNN trained with Adam on a DataLoader whose items are augmented in
Python, and an LSTM language model trained with AdamW and gradient clipping).  Each magic runs once
uninterrupted to learn its duration; then each interrupted run sends one SIGINT uniformly inside that
duration, so it lands anywhere: setup, the user's code, the analysis, the release paths.  After each:
the kernel runs cells, and nothing is left behind or changed: torch's settings, the profiler, grad and
inference mode, gc, fd 2, the SIGINT handler and sys.unraisablehook, threads, child processes, file
descriptors (pipes included), and for the magics that restore them, the weights, the optimizer's state
and the random generators.  A failure prints where; the figures are the counts per magic.

    python -m benchmarks.real_interrupts [--runs 100] [--magics torchprofile,amp_compare,...]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import signal
import sys
import threading
import time

import psutil
import torch

from benchmarks.machine import machine_line

WORKLOADS = {
    "cnn": """
import random, torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)

class Flipped(Dataset):
    def __len__(self):
        return 96
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        image = torch.rand(3, 32, 32, generator=g)
        if random.random() < 0.5:
            image = image.flip(-1)
        return image, i % 10

loader = DataLoader(Flipped(), batch_size=16)
x, y = torch.rand(16, 3, 32, 32), torch.arange(16) % 10

def loss_of(x, y):
    return nn.functional.cross_entropy(model(x), y)

def step(bs):
    opt.zero_grad()
    nn.functional.cross_entropy(model(torch.rand(bs, 3, 32, 32)), torch.arange(bs) % 10).backward()
    opt.step()
""",
    "lstm": """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)

class LanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(500, 64)
        self.lstm = nn.LSTM(64, 96, num_layers=2, batch_first=True)
        self.head = nn.Linear(96, 500)
    def forward(self, tokens):
        return self.head(self.lstm(self.embed(tokens))[0])

model = LanguageModel()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
tokens = torch.randint(0, 500, (256, 33))
loader = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=16, shuffle=True)
x, y = tokens[:16, :-1], tokens[:16, 1:]

def loss_of(x, y):
    return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())

def step(bs):
    t = torch.randint(0, 500, (bs, 33))
    opt.zero_grad()
    nn.functional.cross_entropy(model(t[:, :-1]).flatten(0, 1), t[:, 1:].flatten()).backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
""",
}

TRAIN = """
for _ in range(4):
    opt.zero_grad()
    loss_of(x, y).backward()
    opt.step()
"""

MAGICS = {
    "torchprofile": "%%torchprofile -q --warmup 1 --steps 2 --memory" + TRAIN,
    "amp_compare": "%%amp_compare -q --variants eager,amp,inference_mode --runs 3 --warmup 1" + TRAIN,
    "gpumem": "%%gpumem -q" + TRAIN,
    "autobatch": "%autobatch -q -o result --budget 96MiB --max 256 step",
    "loadertune": "%loadertune -q -o result loader --workers 0,1 --rounds 2 --batches 3",
}
RESTORING = ("amp_compare", "autobatch", "loadertune")  # these run the user's code on copies or put it back


def _state(shell) -> dict:
    from torchmagic.core.settings import TorchSettings

    ns = shell.user_ns
    proc = psutil.Process()
    fds = sorted(os.listdir("/proc/self/fd"))
    return {
        "settings": TorchSettings.capture(),
        "profiler": torch.autograd.profiler._is_profiler_enabled,
        "grad": torch.is_grad_enabled(), "inference_mode": torch.is_inference_mode_enabled(),
        "gc": gc.isenabled(), "fd2": os.fstat(2).st_ino,
        "handler": signal.getsignal(signal.SIGINT), "unraisablehook": sys.unraisablehook,
        "threads": {t.ident for t in threading.enumerate()},
        "children": {p.pid for p in proc.children(recursive=True)},
        "fds": len(fds), "fd_targets": _targets(fds),
        "pipes": sum(os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
                     for fd in fds if os.path.exists(f"/proc/self/fd/{fd}")),
        "weights": [t.detach().clone() for t in ns["model"].state_dict().values()],
        "optimizer": repr(ns["opt"].state_dict()["param_groups"]),
        "optimizer_state": sum(len(s) for s in ns["opt"].state.values()),
        "rng": torch.get_rng_state(), "python_rng": __import__("random").getstate(),
    }


def _targets(fds: list[str]) -> dict[str, str]:
    """fd -> what it points at (a file, pipe:[...], socket:[...]), for a leak's report."""
    from torchmagic.features.loadertune.cut_off import mapped_inodes

    mapped = mapped_inodes() or set()  # shared memory a storage holds is mapped; an orphan is not
    found = {}
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("/dev/shm/"):
                target += " mapped" if os.fstat(int(fd)).st_ino in mapped else " unmapped"
            found[fd] = target
        except OSError:  # listdir's own, closed by now
            pass
    return found


def _differences(before: dict, after: dict, restoring: bool) -> list[str]:
    found = []
    for key in ("settings", "profiler", "grad", "inference_mode", "gc", "fd2", "handler", "unraisablehook"):
        if after[key] != before[key]:
            found.append(f"{key}: {before[key]!r} -> {after[key]!r}")
    if not after["threads"] <= before["threads"]:
        found.append(f"threads left: {len(after['threads'] - before['threads'])}")
    if not after["children"] <= before["children"]:
        found.append(f"child processes left: {sorted(after['children'] - before['children'])}")
    for key in ("fds", "pipes"):
        if after[key] > before[key]:
            new = sorted(set(after["fd_targets"].items()) - set(before["fd_targets"].items()))
            found.append(f"{key}: {before[key]} -> {after[key]}" + (f" (new: {new})" if key == "fds" else ""))
    if restoring:
        if not all(torch.equal(a, b) for a, b in zip(before["weights"], after["weights"])):
            found.append("weights changed")
        if after["optimizer"] != before["optimizer"] or after["optimizer_state"] != before["optimizer_state"]:
            found.append("optimizer changed")
        if not torch.equal(after["rng"], before["rng"]) or after["python_rng"] != before["python_rng"]:
            found.append("random generators changed")
    return found


def _run(shell, source):
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = shell.run_cell(source, store_history=False)
    return result, captured.stdout + captured.stderr


def sweep(shell, workload: str, magic: str, runs: int, rng: random.Random) -> tuple[int, int, list[str]]:
    """(interrupted, completed, failures) over ``runs`` runs of ``magic`` with one real SIGINT each."""
    shell.run_cell(WORKLOADS[workload])
    source = MAGICS[magic]
    _run(shell, source)  # first-use imports and caches
    started = time.perf_counter()
    result, shown = _run(shell, source)
    duration = time.perf_counter() - started
    if not result.success:
        return 0, 0, [f"{workload}/{magic}: the uninterrupted run failed: {result.error_in_exec!r}\n{shown[-1500:]}"]
    interrupted = completed = after_run = before_run = 0
    failures: list[str] = []
    for i in range(runs):
        shell.run_cell(WORKLOADS[workload])  # fresh objects: the cell's training moves the weights
        gc.collect()
        before = _state(shell)
        delay = rng.uniform(0.0, duration)
        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
        try:
            try:
                timer.start()
                result, shown = _run(shell, source)
            except KeyboardInterrupt:  # landed here, before the cell started (a delay near 0, a slow thread start)
                before_run += 1
                timer.join()
                continue
        finally:
            try:  # a signal that arrives after the run is the shell's, not the magic's: it lands here
                timer.join()
                time.sleep(0.01)
            except KeyboardInterrupt:
                after_run += 1
        where = f"{workload}/{magic} #{i} (SIGINT at {delay * 1e3:.0f} ms of {duration * 1e3:.0f})"
        if isinstance(result.error_in_exec, KeyboardInterrupt):
            interrupted += 1
            if "torchmagic/" in shown:
                failures.append(f"{where}: our frames shown:\n{shown[-1200:]}")
        elif result.error_in_exec is None:
            completed += 1
        else:
            failures.append(f"{where}: {result.error_in_exec!r}")
        gc.collect()
        after = _state(shell)
        again, _ = _run(shell, "1 + 1")
        if not (again.success and again.result == 2):
            failures.append(f"{where}: the kernel no longer runs cells: {again.error_in_exec!r}")
        found = _differences(before, after, magic in RESTORING)
        if found:
            failures.append(f"{where}: " + "; ".join(found))
    if after_run:
        print(f"  ({workload}/{magic}: {after_run} SIGINTs landed after the run had ended)")
    if before_run:
        print(f"  ({workload}/{magic}: {before_run} SIGINTs landed before the cell started: not counted)")
    return interrupted, completed, failures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--magics", default=",".join(MAGICS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args()
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "torchmagic")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(machine_line())
    print(f"{args.runs} real SIGINTs per magic and workload, each at a uniform moment of the run\n")
    print(f"{'workload':8s} {'magic':13s} {'interrupted':>11s} {'completed':>9s} {'failures':>8s} {'seconds':>8s}")
    rng = random.Random(0)
    total_failures = []
    for workload in args.workloads.split(","):
        for magic in args.magics.split(","):
            started = time.perf_counter()
            interrupted, completed, failures = sweep(shell, workload, magic, args.runs, rng)
            total_failures += failures
            print(f"{workload:8s} {magic:13s} {interrupted:11d} {completed:9d} {len(failures):8d} "
                  f"{time.perf_counter() - started:8.1f}", flush=True)
    for failure in total_failures[:20]:
        print("\n" + failure)
    print(f"\n{len(total_failures)} failures")
    sys.exit(1 if total_failures else 0)


if __name__ == "__main__":
    main()
