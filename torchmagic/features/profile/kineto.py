"""The vocabulary of kineto's traces, in one place: its event categories (as torch 1.8-1.9 and torch
1.10 onwards name them), the ranges PyTorch records around a step's parts, and which categories are
the device's own work.  The live profiler's events (live_table.py) and trace files (traces/) are read by
these names only.

Two schemas exist.  Torch 1.10 onwards (kineto's current one): ``cpu_op``, ``user_annotation``,
``python_function``, ``cuda_runtime``/``cuda_driver`` (ROCm writes ``cuda_runtime`` too, or
``hip_runtime``), ``kernel``, ``gpu_memcpy``, ``gpu_memset``; the op's id is ``External id``.
Torch 1.8-1.9 (the PyTorch profiler tutorial's traces): ``Operator`` for ops *and* record_function
ranges (ProfilerStep#N, the DataLoader's ``__next__``), ``Runtime``, ``Kernel``, ``Memcpy``,
``Memset``, ``Python``; device and runtime events carry the op's id as ``external id``.
Timestamps are microseconds in both (``displayTimeUnit`` only tells a viewer how to show them).
"""

from __future__ import annotations

import functools
import re

STEP_PREFIX = "ProfilerStep#"
DATA_PREFIX = "enumerate(DataLoader)"
BACKWARD_PREFIX = "autograd::engine::evaluate_function"  # one per backward node, with its forward seq
OPTIMIZER_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#")
# Ranges around a collective: on the thread of a host backend (gloo, MPI, UCC) it executes there; NCCL's
# range on the host only enqueues it (the kernels execute it)
HOST_BACKENDS = ("gloo:", "mpi:", "ucc:")
COLLECTIVE_PREFIXES = HOST_BACKENDS + ("nccl:",)

CPU_OP, USER_ANNOTATION, PYTHON_FUNCTION = "cpu_op", "user_annotation", "python_function"
KERNEL, MEMCPY, MEMSET = "kernel", "gpu_memcpy", "gpu_memset"
DEVICE_ACTIVITIES = frozenset({KERNEL, MEMCPY, MEMSET})
RUNTIME_SUFFIXES = ("_runtime", "_driver")  # cuda_runtime, cuda_driver, hip_runtime, ...
# Read and set aside on purpose: the trace's own span, GPU-side copies of user ranges, CUPTI's sync and
# range records, kineto's overhead markers, flow arrows and instant events
UNREAD_ON_PURPOSE = frozenset({"Trace", "gpu_user_annotation", "cuda_sync", "cuda_profiler_range", "overhead",
                               "cpu_instant_event", "ac2g", "fwdbwd", "async", "flow", "forward_backward"})

# One-time costs: runtime calls that, when slow, are the process starting to use the GPU rather than the
# step's work (each takes microseconds once the process is warm).  Each kind is told apart by its calls.
START_UP_MIN_US = 10_000.0
CUDA_CONTEXT = "creating the CUDA context"
LIBRARY_SET_UP = "setting up streams and libraries (cuDNN, cuBLAS) in an op's first call"
LAZY_LOADING = "loading kernels at their first launch (CUDA's lazy module loading)"
CONTEXT_CALLS = frozenset({"cudaDeviceGetStreamPriorityRange", "cuInit", "cuDevicePrimaryCtxRetain", "cudaSetDevice",
                           "cudaInitDevice", "cudaGetDeviceCount", "cudaGetDevice", "hipInit", "hipSetDevice",
                           "hipGetDeviceCount", "hipDeviceGetStreamPriorityRange"})
SET_UP_CALLS = frozenset({"cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority", "cudaFree",
                          "cudaGetDeviceProperties", "cudaDeviceGetAttribute", "cudaEventCreateWithFlags",
                          "hipStreamCreate", "hipStreamCreateWithFlags", "hipFree", "hipGetDeviceProperties"})
FIRST_COMPILE = "compiling graphs at their first call (torch.compile)"
# torch.compile's compile of a frame, as dynamo_timed records it (the outermost of its nested ranges)
_COMPILE_RANGES = frozenset({"dynamo", "entire_frame_compile", "_compile.compile_inner (dynamo_timed)",
                             "_compile.compile_inner"})
LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                          "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel"})

_EARLIER_SCHEMA = {"Operator": CPU_OP, "Runtime": "cuda_runtime", "Kernel": KERNEL, "Memcpy": MEMCPY,
                   "Memset": MEMSET, "Python": PYTHON_FUNCTION}
_AUTOGRAD_NODE = re.compile(r"^[A-Z]\w*Backward\d*$")
_ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"


def activity(cat, name: str) -> str:
    """The current schema's category of an event whose trace says ``cat``."""
    mapped = _EARLIER_SCHEMA.get(cat)
    if mapped is None:
        return cat if isinstance(cat, str) else ""
    if mapped == CPU_OP and not _is_op(name):
        return USER_ANNOTATION  # torch 1.8-1.9 wrote record_function ranges as operators
    if mapped == "cuda_runtime" and name.startswith("hip"):
        return "hip_runtime"
    return mapped


def _is_op(name: str) -> bool:
    """An operator (aten::mm, c10d::allreduce_, autograd::engine::..., AddmmBackward) as opposed to a
    range the code named (ProfilerStep#3, enumerate(DataLoader)#..., Optimizer.step#SGD.step, ## forward ##)."""
    return "::" in name or bool(_AUTOGRAD_NODE.match(name))


@functools.lru_cache(maxsize=4096)  # read per op: a trace repeats a few hundred names
def is_backward_node(name: str) -> bool:
    """An autograd node's run in backward: ``autograd::engine::evaluate_function: MmBackward0`` since
    torch 1.10; the node itself (``MmBackward``, ``torch::autograd::AccumulateGrad``) before."""
    return name.startswith(BACKWARD_PREFIX) or name == _ACCUMULATE_GRAD or bool(_AUTOGRAD_NODE.match(name))


def is_compile(name: str) -> bool:
    """A range torch.compile records around compiling a frame (at a graph's first call, or a recompile)."""
    return name in _COMPILE_RANGES


def one_time_cost(name: str, dur_us: float, first_call_of_its_op: bool, first_launch_of_its_kernel: bool) -> str | None:
    """What one-time cost a runtime call is (CUDA_CONTEXT, LIBRARY_SET_UP, LAZY_LOADING), or None for the
    step's own work.  Set-up is slow inside an op's first call only (cuDNN's handle and workspace in the
    first convolution); later, a slow cudaFree is the allocator returning memory, which is steady state.
    A launch is slow at a kernel's first launch only; later, a slow launch is the GPU's queue being full
    (the host ahead of a busy GPU)."""
    if dur_us < START_UP_MIN_US:
        return None
    if name in CONTEXT_CALLS:
        return CUDA_CONTEXT
    if name in SET_UP_CALLS and first_call_of_its_op:
        return LIBRARY_SET_UP
    if name in LAUNCH_CALLS and first_launch_of_its_kernel:
        return LAZY_LOADING
    return None


def timing_note(counts: dict[str, int]) -> str | None:
    """A line where the trace's own times are not the run's: CUPTI's range profiler replays each kernel to
    read its hardware counters, so launches and kernels took many times their usual time."""
    if counts.get("cuda_profiler_range"):
        return ("CUPTI's range profiler ran (cuda_profiler_range events): it replays each kernel to read hardware "
                "counters, so launch and kernel times here are far longer than the run's own; profile without it "
                "to judge the time.")
    return None


def is_copy_to_host(name: str) -> bool:
    """A device event that copies to the host ("Memcpy DtoH (Device -> Pageable)"): its call waits for the device."""
    return "DtoH" in name


def is_pageable_upload(name: str) -> bool:
    """A copy to the device from pageable (not pinned) host memory: staged, and synchronous to the host."""
    return "HtoD" in name and "Pageable" in name


def is_runtime(activity_type: str) -> bool:
    return activity_type.endswith(RUNTIME_SUFFIXES)


def external_id(args: dict) -> int:
    """The op an event belongs to: its own id on an op, the launching op's on a runtime call or kernel."""
    value = args.get("External id")
    if value is None:
        value = args.get("external id", 0)  # torch 1.8-1.9, on runtime calls and device events
    return value if isinstance(value, int) else 0


def is_read(activity_type: str) -> bool:
    """Whether the summary reads events of this (current-schema) category."""
    return (activity_type in (CPU_OP, USER_ANNOTATION, PYTHON_FUNCTION) or activity_type in DEVICE_ACTIVITIES
            or is_runtime(activity_type))


def _unread(counts: dict[str, int]) -> dict[str, int]:
    """The categories (with their event counts) that nothing here reads and none is set aside on purpose."""
    return {cat: n for cat, n in counts.items() if not is_read(cat) and cat not in UNREAD_ON_PURPOSE}


def unread_device(counts: dict[str, int]) -> str | None:
    """The accelerator whose work a trace holds in categories not read here ('mtia' for MTIA's
    ``mtia_ccp_events``), or None."""
    return next((cat.split("_", 1)[0] for cat in _unread(counts) if "_" in cat), None)


def unread_note(counts: dict[str, int]) -> str | None:
    """One line naming the categories of timed events a trace holds that nothing here reads, or None."""
    unread = _unread(counts)
    if not unread:
        return None
    listed = ", ".join(f"{n:,} '{cat or '(none)'}'" for cat, n in sorted(unread.items(), key=lambda kv: (-kv[1], kv[0])))
    return (f"Not read: timed events of categories this version does not understand ({listed}); the figures "
            "above leave them out (an accelerator other than CUDA or ROCm, or a newer kineto schema).")
