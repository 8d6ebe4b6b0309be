"""The fixed traces whose operator summaries are recorded (recorded.py): synthetic ones holding each case the
summary tells apart (nesting, phases, syncs, copies, matmuls, memory, threads, FLOPs), random ones from fixed
seeds, and the public and H200 traces of tests/data; each whole, and where it has steps in groups of steps."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable

from .synthetic import event, write_trace

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "traces")
RANDOM_SEEDS = range(25)


def _memory(ts: float, nbytes: int, device_type: int = 0, tid=1) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": tid, "ts": ts, "s": "t",
            "args": {"Total Reserved": 0, "Total Allocated": 0, "Bytes": nbytes, "Addr": 1, "Device Type": device_type,
                     "Device Id": 0 if device_type else -1}}


def _step(number: int, start: float, tid=1):
    return event(f"ProfilerStep#{number}", start, 1000, cat="user_annotation", tid=tid)


def _cases(t: float) -> list[dict]:
    """One step's worth of what the sweep tells apart, from time ``t``."""
    bf16, fp32 = ["c10::BFloat16", "c10::BFloat16"], ["float", "float"]
    return [
        event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 10, 90, cat="user_annotation"),
        event("aten::stack", t + 20, 30),
        event("aten::linear", t + 110, 190, **{"Sequence number": 5}),
        event("aten::t", t + 115, 5),
        event("aten::addmm", t + 120, 170, **{"Input type": fp32 + ["float"], "Input Dims": [[4], [4, 8], [8, 4]],
                                               "Concrete Inputs": ["", "", "", "1", "1"]}),
        event("train.py(10): step", t + 300, 30, cat="python_function"),  # the user's code ...
        event("site-packages/lib/mod.py(5): f", t + 300, 28, cat="python_function"),  # ... calling a library
        event("site-packages/lib/inner.py(9): g", t + 300, 26, cat="python_function"),  # (the first call counts)
        event("aten::item", t + 300, 20),
        event("aten::_local_scalar_dense", t + 305, 10),
        event("aten::empty", t + 330, 0),
        event("aten::view", t + 330, 0),  # two zero-length events at one start
        event("aten::zeros_like", t + 331, 9),
        _memory(t + 331.5, 4096),  # allocated under zeros_like: its row is made now, before new_fill's
        event("aten::new_fill", t + 332, 3),
        _memory(t + 333, 512, device_type=1),  # under new_fill, on cuda:0
        _memory(t + 336, -4096),  # freed
        event("## a range ##", t + 341, 4, cat="user_annotation"),
        _memory(t + 342, 64),  # under a user range: no op's
        event("aten::outer_alloc", t + 350, 20),
        event("aten::inner_op", t + 351, 2),
        _memory(t + 355, 256),  # its visit closes inner_op first: inner_op's row comes before outer_alloc's
        event("aten::add", t + 400, 50, **{"Sequence number": 6}),
        event("aten::copy_", t + 420, 60),  # outlives its parent
        event("aten::contiguous", t + 500, 20),
        event("aten::clone", t + 505, 10),
        event("aten::copy_", t + 506, 8),
        event("entire_frame_compile", t + 530, 70, cat="user_annotation"),
        event("aten::mm", t + 540, 20, **{"Input type": fp32, "Input Dims": [[4, 4], [4, 4]]}),
        event("autograd::engine::evaluate_function: MmBackward0", t + 600, 100, **{"Sequence number": 5}),
        event("MmBackward0", t + 610, 80, **{"Sequence number": 5}),
        event("aten::mm", t + 620, 60, **{"Input type": bf16, "Input Dims": [[8, 16], [16, 8]]}),
        event("Optimizer.step#SGD.step", t + 700, 100, cat="user_annotation"),
        event("aten::_foreach_add_", t + 710, 60),
        event("_compile.compile_inner", t + 775, 20, cat="user_annotation"),  # a compile inside a phase: start-up
        event("## forward ##", t + 800, 100, cat="user_annotation"),
        event("aten::relu", t + 810, 80, **{"Sequence number": 7}),
        event("aten::relu", t + 920, 30, **{"Sequence number": 8}),  # Python between it and the one before
        event("## tie ##", t + 960, 20, cat="user_annotation"),  # copies and forward 10 µs each: the first closed
        event("aten::copy_", t + 960, 10),
        event("aten::relu", t + 970, 10),
        event("autograd::engine::evaluate_function: AddBackward0", t + 200, 300, tid=2, **{"Sequence number": 6}),
        event("aten::mul", t + 210, 100, tid=2),
    ]


def synthetic_cases(folder: str) -> str:
    events = [event("PyTorch Profiler (0)", -5, 4000, cat="Trace"), _step(1, 0), _step(2, 1000), _step(3, 2000),
              event("## training loop ##", -3, 3500, cat="user_annotation")]  # open across every group's start
    events += _cases(0) + _cases(1000)
    events += [event("aten::neg", 2010, 10)]  # Python from step 2's last op to it is not a gap: another step
    events += [event("aten::ones", 3100, 100), event("aten::zeros", 3150, 10, tid="a thread")]  # after the steps
    events += [_memory(-4, 1 << 20), _memory(3120, 8)]  # held from before the steps; allocated after them
    return str(write_trace(os.path.join(folder, "cases.json"), events))


def flops_conv(folder: str) -> str:
    """A file profiled with_flops: a convolution with its kernel, a pointwise op."""
    conv = {"Input Dims": [[2, 3, 8, 8], [4, 3, 3, 3], [4]] + [[]] * 6, "Input type": ["float"] * 3 + [""] * 6,
            "Concrete Inputs": ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]}
    events = [_step(1, 0),
              event("aten::conv2d", 10, 100, **{"External id": 1}, **conv),
              event("aten::convolution", 12, 96, **{"External id": 2}, **conv),
              event("aten::_convolution", 14, 92, **{"External id": 3}, **conv),
              event("aten::cudnn_convolution", 16, 88, **{"External id": 4}),
              event("cudaLaunchKernel", 20, 10, cat="cuda_runtime", correlation=100, **{"External id": 4}),
              event("implicit_gemm", 40, 30, cat="kernel", tid=7, correlation=100, **{"External id": 4}),
              event("aten::add", 200, 10, **{"External id": 5, "Input Dims": [[2, 4, 6, 6], [2, 4, 6, 6]],
                                             "Input type": ["float", "float"], "Concrete Inputs": ["", "", "1"]})]
    path = os.path.join(folder, "flops.json")
    with open(write_trace(path, events)) as f:
        data = json.load(f)
    data["with_flops"] = 1
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def no_steps(folder: str) -> str:
    """No marker: one step around the whole trace, on the thread that ran most ops (the first of those tied)."""
    events = [event("aten::mm", 10 * i, 5, tid=1 + i % 2) for i in range(10)]
    events += [event("## a range ##", 3, 40, cat="user_annotation", tid=3)]
    return str(write_trace(os.path.join(folder, "flat.json"), events))


def kernel_of_no_length(folder: str) -> str:
    """A kernel of no length whose launch is not in the trace, after a group's last step, carried to the next
    group (an interval of no length): the next group's data loading is then counted as exposed."""
    events = [_step(1, 0) | {"dur": 100}, _step(2, 200) | {"dur": 100},
              event("gemm_kernel", 150, 0, cat="kernel", tid=7),
              event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 210, 50, cat="user_annotation")]
    return str(write_trace(os.path.join(folder, "t.json"), events))


def stair(folder: str) -> str:
    """Each op starts inside the one before and ends after it (1 ns of clock jitter): 2,000 deep."""
    events = [_step(1, 0)] + [event("aten::add", 1 + 0.4 * i, 0.401) for i in range(2000)]
    return str(write_trace(os.path.join(folder, "stair.json"), events))


_VOCABULARY = [  # (name, category): a name of each kind the sweep tells apart
    ("aten::mm", "cpu_op"), ("aten::addmm", "cpu_op"), ("aten::add", "cpu_op"), ("aten::item", "cpu_op"),
    ("aten::_local_scalar_dense", "cpu_op"), ("aten::copy_", "cpu_op"), ("aten::contiguous", "cpu_op"),
    ("aten::empty", "cpu_op"), ("aten::_foreach_add_", "cpu_op"), ("MmBackward0", "cpu_op"),
    ("autograd::engine::evaluate_function: MmBackward0", "cpu_op"), ("Optimizer.step#SGD.step", "user_annotation"),
    ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation"),
    ("## forward ##", "user_annotation"), ("entire_frame_compile", "user_annotation"),
    ("train.py(3): step", "python_function"), ("site-packages/lib/mod.py(1): f", "python_function"),
    ("site-packages/lib/inner.py(2): g", "python_function"),
]


_RUNTIME = [("cudaLaunchKernel", "cuda_runtime"), ("cuLaunchKernel", "cuda_driver"),
            ("cudaMemcpyAsync", "cuda_runtime"), ("cudaStreamSynchronize", "cuda_runtime"), ("cudaFree", "cuda_runtime"), ("cuInit", "cuda_driver")]
_DEVICE = [("gemm_kernel", "kernel"), ("other_kernel", "kernel"), ("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy"),
           ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy"), ("Memset (Device)", "gpu_memset")]


class _Ids:
    """Increasing ids as kineto writes them: an op's External id, a runtime call's CUPTI correlation id."""

    def __init__(self):
        self.op, self.call = 0, 0


def _random_trace(rng, device: bool = False) -> list[dict]:
    """Steps of randomly nested events on two threads, in a shuffled or kept file order, times rounded to the
    ns as kineto writes them, children now and then outliving their parent by a ns, memory records among them;
    with ``device``, ops on a third thread (tid 0), runtime calls (some on an OS thread id of their own, some slow
    enough to be a one-time cost, some outside any op) and the kernels, copies and memsets they launch on two
    streams (some lost, some never launched in the trace, some stamped before their launch)."""
    events, t, ids = [], rng.uniform(0, 1e6), _Ids()

    def call(at: float, end: float, tid: int, op: int) -> None:
        name, cat = rng.choice(_RUNTIME)
        ids.call += 1
        dur = round(rng.uniform(0, end - at), 3)
        links = {"correlation": ids.call, "External id": op if rng.random() < 0.9 else rng.randint(0, ids.op)}
        events.append(event(name, round(at, 3), dur, cat=cat, tid=tid if rng.random() < 0.5 else 10 + tid, **links))
        if rng.random() < 0.85:
            kernel, kind = rng.choice(_DEVICE)
            skew = rng.uniform(-50, 0) if rng.random() < 0.1 else rng.uniform(0, 3 * (dur + 1))  # clocks apart
            events.append(event(kernel, round(at + skew, 3), round(rng.uniform(0, 20), 3), cat=kind,
                                tid=rng.choice([7, 8]), **links))
        if rng.random() < 0.05:  # a kernel whose launch is not in the trace
            events.append(event("lost_kernel", round(at, 3), 1.0, cat="kernel", tid=7,
                                correlation=ids.call + rng.choice([0, 100]), **{"External id": op}))

    def children(start: float, end: float, depth: int, op: int = 0) -> None:
        at = start
        while depth < 6 and at < end and rng.random() < 0.7:
            if device and rng.random() < 0.3:
                call(at, end, rng.choice([1, 1, 2]), op)
                at = round(at + rng.uniform(0, end - at), 3)
                continue
            name, cat = rng.choice(_VOCABULARY)
            dur = round(rng.uniform(0, (end - at) * 0.8), 3) + (0.001 if rng.random() < 0.1 else 0.0)
            ids.op += 1
            args = {"Sequence number": rng.randint(-1, 5), "External id": ids.op}
            if name in ("aten::mm", "aten::addmm") and rng.random() < 0.7:
                args.update({"Input type": [rng.choice(["float", "c10::BFloat16", "c10::Half"])] * 2,
                             "Input Dims": [[rng.choice([4, 8]), 4], [4, rng.choice([4, 3])]]})
            tid = rng.choice([1, 1, 1, 2] + ([0] if device else []))  # 0: a falsy id the linking reads past
            events.append(event(name, round(at, 3), round(dur, 3), cat=cat, tid=tid, **args))
            if rng.random() < 0.2:
                events.append(_memory(round(at + dur / 2, 3), rng.choice([64, -64, 4096]), rng.choice([0, 1])))
            children(at, at + dur, depth + 1, ids.op if cat == "cpu_op" else op)
            at = round(at + dur + rng.choice([0.0, 0.0, 0.5, 2.0]), 3)

    for number in range(rng.randint(0, 4)):
        length = round(rng.uniform(50, 500) * (100 if device and rng.random() < 0.3 else 1), 3)  # long: slow calls
        events.append(_step(number + 1, round(t, 3)) | {"dur": length})
        children(t, t + length, 0)
        t += length + rng.choice([0.0, 1.0])
    children(t, t + 100, 1)  # after the steps
    if rng.random() < 0.5:
        rng.shuffle(events)
    return events


def _random_case(seed: int, device: bool) -> Callable[[str], str | None]:
    def make(folder: str) -> str | None:
        events = _random_trace(random.Random(seed), device)
        if not any(e.get("ph") == "X" for e in events):
            return None
        return str(write_trace(os.path.join(folder, "t.json"), events))
    return make


GPU = os.path.join(os.path.dirname(__file__), "..", "..", "data", "gpu")
DEVICE_TRACES = [os.path.join(GPU, name) for name in sorted(os.listdir(GPU)) if name.endswith(".json.gz")] + [
    os.path.join(DATA, name) for name in sorted(os.listdir(DATA))
    if name.endswith(".json.gz") and not name.startswith("hta_cpu_")] + [
    os.path.join(DATA, "hta_sampled_job", name) for name in sorted(os.listdir(os.path.join(DATA, "hta_sampled_job")))]




def _public(path: str) -> Callable[[str], str]:
    return lambda folder: path


CASES: dict[str, Callable[[str], str | None]] = {
    "synthetic_cases": synthetic_cases, "flops_conv": flops_conv, "no_steps": no_steps,
    "kernel_of_no_length": kernel_of_no_length, "stair": stair,
    **{f"random_host_{seed}": _random_case(seed, False) for seed in RANDOM_SEEDS},
    **{f"random_device_{seed}": _random_case(seed, True) for seed in RANDOM_SEEDS},
    **{os.path.relpath(path, os.path.join(DATA, "..")): _public(path)
       for path in [os.path.join(DATA, "hta_cpu_train_eval.json.gz"), os.path.join(DATA, "hta_cpu_gloo_rank-34.json.gz")]
       + DEVICE_TRACES},
}
GROUPINGS = (None, 1, 2)  # whole, in groups of one step, of two (a trace with steps)
