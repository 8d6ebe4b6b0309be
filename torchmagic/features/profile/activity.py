"""The kineto activity type of a profiler event, on every torch we support.

torch 2.13 tells it (``_KinetoEvent.activity_type()``); torch 2.4 to 2.12 do not, and a CUDA build of
2.11 is what many GPU users have. There it is inferred from what those versions do expose, the way
torch's own ``_parse_kineto_results`` tells events apart: the device the event ran on, the
annotation and Python-function flags, and the names CUDA/HIP runtime calls and copies always have.
"""

import re

from torch._C._autograd import DeviceType, _KinetoEvent

# kineto's own CPU-side bookkeeping (activity type "overhead"), never the user's work
_OVERHEAD_NAMES = frozenset({"CUPTI Overhead", "Instrumentation", "Resource", "Buffer Flush",
                             "Activity Buffer Request", "Runtime Triggered Module Loading",
                             "Lazy Function Loading", "COMMAND_BUFFER_FULL"})
# cudaLaunchKernel, cuLaunchKernel, hipMemcpyAsync, cudaGraphLaunch: a runtime or driver call's name
_RUNTIME_NAME = re.compile(r"^(cuda|cu|hip)[A-Z]\w*$")
_SYNC_SUFFIXES = ("Sync", "Wait Event")  # CUPTI synchronization records: Stream Sync, Event Sync, ...


def activity_reader(sample=None):
    """A function event -> activity type, using torch's own answer where the events (``sample`` is one
    of them) or, without a sample, this torch build have one."""
    if hasattr(_KinetoEvent if sample is None else sample, "activity_type"):
        return lambda e: e.activity_type()
    return inferred_activity


def inferred_activity(e) -> str:
    """The activity type of an event from a torch without ``activity_type()``."""
    name = e.name()
    if name == "[memory]":  # an allocation or free, on whichever device it happened
        return "cpu_instant_event"
    if e.device_type() == DeviceType.CPU:
        if _flag(e, "is_python_function"):
            return "python_function"
        if _flag(e, "is_user_annotation"):
            return "user_annotation"
        if name in _OVERHEAD_NAMES:
            return "overhead"
        # runtime and driver calls: torch ops are named with a namespace (aten::mm) or a phrase, never
        # cudaXxx/cuXxx/hipXxx.  Not only those an op encloses (linked to it): torch.cuda.synchronize()
        # and a CUDA graph's replay (cudaGraphLaunch) are calls no op makes
        if _RUNTIME_NAME.match(name):
            return "hip_runtime" if name.startswith("hip") else "cuda_runtime"
        return "cpu_op"
    if _flag(e, "is_user_annotation"):
        return "gpu_user_annotation"
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    if name.startswith("Memset"):
        return "gpu_memset"
    if name.endswith(_SYNC_SUFFIXES):
        return "cuda_sync"
    return "kernel"


def _flag(e, method: str) -> bool:
    """An event's boolean flag; False where this torch's events lack the method."""
    read = getattr(e, method, None)
    return bool(read()) if read is not None else False


def python_calls(results) -> list[tuple[str, int, int, int]]:
    """The Python tracer's calls, (name, start ns, end ns, thread), where this torch leaves them out
    of ``results.events()``: before ``is_python_function()`` existed they are only in the event tree
    (and in the exported trace).  Empty where the events already hold them."""
    if hasattr(_KinetoEvent, "is_python_function"):
        return []
    from torch._C._profiler import _EventType
    python = (_EventType.PyCall, _EventType.PyCCall)
    calls, pending = [], list(results.experimental_event_tree())
    while pending:
        event = pending.pop()
        pending.extend(event.children)
        if event.tag in python:
            calls.append((event.name, event.start_time_ns, event.end_time_ns, event.start_tid))
    return calls
