"""Real GPU output to keep as test fixtures: one prepared run for the first session lent a GPU.

    python benchmarks/gpu_capture.py OUT_DIR [--device cuda]

On the device machine (see ../shared/gpu/README.md), after the gpu tier, in the same call:

    bash .gpu-wheels/on-device.sh -m gpu -x; python benchmarks/gpu_capture.py "$OUT"

It writes three files (the device tool brings back at most 8, 16 MiB each):

* ``gpu_traces.tar``: kineto traces (gzipped) of a few steps each, written by ``torchmagic.profile(trace=)``:
  an fp32 MLP training step, the same under bf16 autocast, ``torch.compile``, CUDA graphs
  (``mode="reduce-overhead"``), a step with an explicit ``torch.cuda.synchronize()`` and ``.item()``, and
  a DataLoader-bound step (a slow per-item transform, 0 workers);
* (the dry run on CPU leaves out the compiled steps: inductor's first compile takes tens of seconds there)
* ``allocator_history.pickle.gz``: ``torch.cuda.memory._snapshot()`` after recording a training step's
  allocations with Python stacks;
* ``capture.json``: the machine (GPU, driver, torch, CUDA), each trace's figures as torchmagic reads them
  beside the same step timed with CUDA events, out-of-memory messages (the allocator's, and one from a
  cuBLAS handle where the device can be filled), and NVML's readings (memory, this process's entry).

``--device cpu`` runs what needs no GPU (the traces, on the CPU) so the script is tested on every
machine (tests/test_gpu_capture.py); the GPU-only parts say "skipped: no CUDA" in capture.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import platform
import sys
import tarfile
import tempfile
import time
import traceback

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torchmagic  # noqa: E402
from benchmarks.gpu_figures import event_seconds  # noqa: E402

STEPS, WARMUP = 4, 2


def mlp(width: int, device: str) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10)).to(device)


def training_step(model, x, y, opt, autocast: bool = False):
    def step():
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


class SlowItems(torch.utils.data.Dataset):
    """A dataset whose per-item transform is Python-bound: the loader, not the GPU, sets the pace."""

    def __init__(self, n: int, width: int):
        self.n, self.width = n, width

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        values = [((i * 31 + j * 17) % 97) / 97.0 for j in range(64)]  # pure Python on purpose
        return torch.tensor(values).repeat(self.width // 64), i % 10


def workloads(device: str, width: int, batch: int):
    """name -> a zero-argument step, built fresh for each (its own model and optimizer)."""
    def plain(autocast=False, compile_mode=None):
        model = mlp(width, device)
        if compile_mode is not None:
            model = torch.compile(model, mode=compile_mode)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(batch, width, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        return training_step(model, x, y, opt, autocast)

    def synced():
        step = plain()

        def with_syncs():
            loss = step()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            return loss.item()
        return with_syncs

    def loader_bound():
        model = mlp(width, device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        loader = torch.utils.data.DataLoader(SlowItems(batch * 4 * (STEPS + WARMUP + 1), width), batch_size=batch)
        batches = iter(loader)

        def step():
            x, y = next(batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            return training_step(model, x, y, opt)()
        return step

    yield "fp32_training", plain
    yield "bf16_autocast_training", lambda: plain(autocast=True)
    if device.startswith("cuda"):  # on CPU, inductor's first compile alone takes tens of seconds
        yield "compiled_training", lambda: plain(compile_mode="default")
        yield "cuda_graphs_training", lambda: plain(compile_mode="reduce-overhead")
    yield "explicit_sync", synced
    yield "dataloader_bound", loader_bound


def capture_traces(device: str, folder: str, width: int, batch: int) -> dict:
    figures = {}
    for name, build in workloads(device, width, batch):
        path = os.path.join(folder, f"{name}.json")
        entry = figures[name] = {}
        try:
            started = time.perf_counter()
            result = torchmagic.profile(build(), steps=STEPS, warmup=WARMUP, record_shapes=True, trace=path,
                                        device=device, label=name)
            entry.update(seconds=round(time.perf_counter() - started, 2), step_s=result.step_s,
                         findings=[(f.rule, f.severity, f.title) for f in result.findings], notes=result.notes,
                         device_categories_s=result.device_categories_s, kernel_stats=result.kernel_stats,
                         events=result.event_count,
                         cuda_event_step_s=event_seconds(build(), calls=10) if torch.cuda.is_available() else None)
            with open(path, "rb") as raw, gzip.open(path + ".gz", "wb") as packed:
                packed.write(raw.read())
            os.remove(path)
        except Exception as exc:  # keep going: one failure must not lose the other captures
            entry["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            entry["traceback"] = traceback.format_exc()[-3000:]
    return figures


def capture_allocator_history(out: str, width: int, batch: int) -> dict:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA"}
    step = workloads("cuda", width, batch).__next__()[1]()
    step()
    torch.cuda.memory._record_memory_history(max_entries=20_000)
    try:
        step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    with gzip.open(os.path.join(out, "allocator_history.pickle.gz"), "wb") as f:
        pickle.dump(snapshot, f)
    return {"segments": len(snapshot.get("segments", [])),
            "trace_entries": sum(len(t) for t in snapshot.get("device_traces", []))}


def capture_out_of_memory() -> dict:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA"}
    messages = {}
    free, total = torch.cuda.mem_get_info()
    try:
        torch.empty(int(total * 2), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as exc:
        messages["allocator"] = str(exc)
    held = []
    try:  # fill the device, then ask cuBLAS for a fresh handle's workspace on a new stream
        while True:
            held.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        pass
    try:
        with torch.cuda.stream(torch.cuda.Stream()):
            a = torch.randn(64, 64, device="cuda")
            (a @ a).sum().item()
        messages["full_device_matmul"] = "ran"
    except Exception as exc:  # cuBLAS reports some failures as CUBLAS_STATUS_ALLOC_FAILED, not OutOfMemoryError
        messages["full_device_matmul"] = f"{type(exc).__name__}: {exc}"
    del held
    torch.cuda.empty_cache()
    return messages


def capture_nvml() -> dict:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA"}
    try:
        import pynvml
    except ImportError as exc:
        return {"error": str(exc)}
    keep = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return {"name": pynvml.nvmlDeviceGetName(handle), "uuid": pynvml.nvmlDeviceGetUUID(handle),
                "memory": {"total": memory.total, "used": memory.used, "free": memory.free},
                "processes": [{"pid": p.pid, "used": p.usedGpuMemory} for p in processes],
                "this_pid": os.getpid(), "torch_reserved": torch.cuda.memory_reserved(),
                "torch_allocated": torch.cuda.memory_allocated(), "held_bytes": keep.numel()}
    finally:
        pynvml.nvmlShutdown()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the folder to write into ($OUT on the device machine)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--width", type=int, default=None, help="the MLP's width (4096 on a GPU, 256 on CPU)")
    parser.add_argument("--batch", type=int, default=None)
    args = parser.parse_args(argv)
    gpu = args.device.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        print("no CUDA device: nothing captured (run with --device cpu for the dry run)")
        return 0
    width, batch = args.width or (4096 if gpu else 256), args.batch or (1024 if gpu else 64)
    os.makedirs(args.out, exist_ok=True)
    capture = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "device": args.device,
                           "gpu": torch.cuda.get_device_name() if gpu else None,
                           "width": width, "batch": batch, "steps": STEPS, "warmup": WARMUP}}
    with tempfile.TemporaryDirectory() as folder:
        capture["traces"] = capture_traces(args.device, folder, width, batch)
        with tarfile.open(os.path.join(args.out, "gpu_traces.tar"), "w") as tar:
            for name in sorted(os.listdir(folder)):
                tar.add(os.path.join(folder, name), arcname=name)
    for part, capture_part in (("allocator_history", lambda: capture_allocator_history(args.out, width, batch)),
                               ("out_of_memory", capture_out_of_memory), ("nvml", capture_nvml)):
        try:
            capture[part] = capture_part() if gpu else {"skipped": "no CUDA"}
        except Exception as exc:
            capture[part] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    with open(os.path.join(args.out, "capture.json"), "w") as f:
        json.dump(capture, f, indent=1, default=str)
    for name, entry in capture["traces"].items():
        if "error" in entry:
            print(f"{name}: FAILED {entry['error']}")
        else:
            steps = entry["step_s"]
            print(f"{name}: {sum(steps) / len(steps) * 1e3:.2f} ms a step (CUDA events: "
                  f"{entry['cuda_event_step_s'] * 1e3:.2f} ms)" if entry["cuda_event_step_s"] else
                  f"{name}: {sum(steps) / len(steps) * 1e3:.2f} ms a step", "·",
                  ", ".join(f"{rule} [{severity}]" for rule, severity, _ in entry["findings"]) or "no findings")
    print("written:", ", ".join(sorted(os.listdir(args.out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
