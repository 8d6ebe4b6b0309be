"""Kineto's raw events reduced to light records (µs since the trace's start), CPU and device apart,
with runtime calls joined to the thread of the op that made them."""

from __future__ import annotations

from .activity import activity_reader, is_hidden
from .kineto import CPU_OP, DEVICE_ACTIVITIES, PYTHON_FUNCTION, USER_ANNOTATION, is_runtime

# event kinds
OP, ANNOTATION, PYTHON, RUNTIME, MEMORY = range(5)
DEVICE = 5  # read as an OP, in the device's list
_CPU_KINDS = {CPU_OP: OP, USER_ANNOTATION: ANNOTATION, PYTHON_FUNCTION: PYTHON}
# the profiler's own bookkeeping around record_function ranges
_SKIPPED_NAMES = frozenset({"profiler::_record_function_enter", "profiler::_record_function_enter_new",
                            "profiler::_record_function_exit"})


class Ev:
    """A raw event reduced to what every event needs; the rest is read from ``raw`` on demand
    (each read of a kineto event attribute costs ~0.4 µs, the main cost of the analysis)."""

    # corr: the correlation id kernels are linked by (set on runtime calls and device events, and on
    # ops when there are kernels); cats: self µs by category under a timeline bar (set on bars only)
    __slots__ = ("name", "start", "end", "tid", "corr", "kind", "raw", "cats")

    def __init__(self, name, start, end, tid, kind, raw):
        self.name, self.start, self.end, self.tid = name, start, end, tid
        self.kind, self.raw, self.corr = kind, raw, 0


def event_kind(activity: str, name: str) -> int | None:
    """The kind of light record an event of ``activity`` named ``name`` becomes (DEVICE: a device's, read
    as an OP apart from the CPU's), or None where the summary leaves such events out."""
    kind = _CPU_KINDS.get(activity)
    if kind is None:
        if activity in DEVICE_ACTIVITIES:
            return DEVICE
        if name == "[memory]":
            return MEMORY
        if not is_runtime(activity):
            return None  # profiler overhead markers, GPU-side annotations, sync records
        kind = RUNTIME  # a CUDA/HIP runtime or driver call, linked to the op that made it
    return None if name in _SKIPPED_NAMES else kind


def read_events(events, trace_start_ns, out) -> tuple[list[Ev], list[Ev]]:
    """Convert raw events to light records, CPU and device apart (counting each in ``out.event_count``)."""
    cpu, device = [], []
    t0 = trace_start_ns
    activity_of = activity_reader(events[0] if events else None)
    for e in events:
        out.event_count += 1
        try:
            name = e.name()
            activity = activity_of(e)
        except UnicodeDecodeError:
            # torch 2.13's Python tracer sometimes returns a garbled name for its own frames
            # (seen: torch/profiler/_cupti_monitor.py); such an event is not the user's
            continue
        kind = event_kind(activity, name)
        if kind is None:
            continue
        if kind == DEVICE:
            start = (e.start_ns() - t0) / 1000.0
            ev = Ev(name, start, start + e.duration_ns() / 1000.0, e.device_resource_id(), OP, e)
            ev.corr = e.linked_correlation_id()
            device.append(ev)
            continue
        if kind == MEMORY:
            start = (e.start_ns() - t0) / 1000.0
            cpu.append(Ev(name, start, start, e.start_thread_id(), MEMORY, e))
            continue
        if e.is_async() or is_hidden(e):
            continue
        start = (e.start_ns() - t0) / 1000.0
        ev = Ev(name, start, start + e.duration_ns() / 1000.0, e.start_thread_id(), kind, e)
        if kind == RUNTIME:
            ev.corr = e.linked_correlation_id()
        cpu.append(ev)
    return cpu, device


def link_runtime_threads(cpu: list[Ev]) -> None:
    """Join runtime calls to their op's thread (CUPTI reports OS thread ids), and give ops
    their correlation ids, which only matter when there are kernels to attribute.  Unlinked
    calls (a bare torch.cuda.synchronize()) go to the thread their OS thread was seen to be."""
    corr_tid = {}
    for ev in cpu:
        if ev.kind == OP:
            ev.corr = ev.raw.correlation_id()
            corr_tid[ev.corr] = ev.tid
    runtime = [ev for ev in cpu if ev.kind == RUNTIME]
    os_thread = {ev.tid: corr_tid[ev.corr] for ev in runtime if ev.corr in corr_tid}
    for ev in runtime:
        ev.tid = corr_tid.get(ev.corr) or os_thread.get(ev.tid, ev.tid)
