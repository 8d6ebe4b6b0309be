"""Turn the profiler's raw events into a :class:`TraceSummary` the diagnosis rules can read.

We read kineto's raw events rather than ``prof.events()``/``key_averages()``: building
torch's FunctionEvent tree costs ~90 µs an event (11 s for 125k events on our CI machine),
while one sweep over the raw events here costs a few µs each.

One sweep per CPU thread, over events sorted by start, keeps a stack of open events.
From it each event gets its parent, its self time (duration minus children), and the
inherited context that decides where its self time belongs:

* the *phase* it runs in: data loading (``enumerate(DataLoader)...__next__``), backward
  (``autograd::engine::evaluate_function``) or optimizer (``Optimizer.step#``/``zero_grad#``),
* whether it is inside a host-device sync op (``.item()``, ``nonzero`` ...) or a copy op,
* the step it belongs to (``ProfilerStep#N`` markers), and the innermost user source frame
  when the python tracer ran (``--stack``).
"""

from __future__ import annotations

import bisect
import functools
import importlib.util
import math
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from torch.autograd import DeviceType

from ...core.gc_pause import gc_paused
from ...core.measure.low_precision import OpCall, freeze
from ...core.measure.timing import DEVICE_WAIT_MARKER
from .activity import activity_reader, is_hidden
from .intervals import intersection, near, overlap, subtract, union
from .kineto import (COLLECTIVE_PREFIXES, CPU_OP, DATA_PREFIX, DEVICE_ACTIVITIES, FIRST_COMPILE, LAUNCH_CALLS,
                     OPTIMIZER_PREFIXES, PYTHON_FUNCTION, START_UP_MIN_US, STEP_PREFIX, USER_ANNOTATION,
                     is_backward_node, is_compile, is_runtime, one_time_cost)
from .flops import FlopAttribution
from .traffic import MATMUL_OPS, off_tensor_core_grain, tensor_traffic
from .result import TimelineSpan as Span  # a bar: a step's top-level event, or a kernel

DATA, FORWARD, BACKWARD, OPTIMIZER, COPIES, SYNCS, COMMUNICATION, DEVICE_WAIT, START_UP, OTHER = (
    "data loading",
    "forward",
    "backward",
    "optimizer",
    "copies",
    "syncs",
    "communication",  # collectives: gloo's and MPI's run on the host, NCCL's range only enqueues its kernels
    "device wait",  # the CPU waiting at step end for queued GPU work (GPU-bound: good)
    "start-up",     # one-time costs (the CUDA context, lazy kernel loading, a first compile): not the steady state
    "other",        # Python between ops, user annotations' own time
)
CATEGORIES = (DATA, FORWARD, BACKWARD, OPTIMIZER, COPIES, SYNCS, COMMUNICATION, DEVICE_WAIT, START_UP, OTHER)

_PHASE_PREFIXES = (
    (DEVICE_WAIT_MARKER, DEVICE_WAIT),
    (DATA_PREFIX, DATA),
    *((prefix, OPTIMIZER) for prefix in OPTIMIZER_PREFIXES),
    *((prefix, COMMUNICATION) for prefix in COLLECTIVE_PREFIXES),
)
# Ops that read a device value on the host: a full stall when the tensor lives on a GPU.
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero",
                      "aten::equal", "aten::unique", "aten::_unique2", "aten::masked_select"})
# Runtime calls that block the host until the device catches up (CUDA traces only).
SYNC_RUNTIME = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                          "cudaMemcpy", "hipStreamSynchronize", "hipDeviceSynchronize"})
COPY_OPS = frozenset({"aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone",
                      "aten::_copy_from", "aten::_copy_from_and_resize", "aten::pin_memory",
                      "aten::_pin_memory"})
LOW_PRECISION_DTYPES = frozenset({"c10::BFloat16", "c10::Half", "c10::Float8_e4m3fn", "c10::Float8_e5m2"})
# Ops that never launch device work (views, metadata, allocation): a step of only these on a GPU has no kernels
NO_KERNEL_OPS = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::_unsafe_view",
    "aten::reshape", "aten::_reshape_alias", "aten::as_strided", "aten::t", "aten::transpose", "aten::permute",
    "aten::expand", "aten::squeeze", "aten::unsqueeze", "aten::select", "aten::slice", "aten::narrow",
    "aten::alias", "aten::detach", "aten::detach_", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
    "aten::split", "aten::chunk", "aten::unbind", "aten::flatten", "aten::requires_grad_", "aten::size",
})
# the profiler's own bookkeeping around record_function ranges
_SKIPPED_NAMES = frozenset({"profiler::_record_function_enter", "profiler::_record_function_enter_new",
                            "profiler::_record_function_exit"})
_NOT_USER_CODE = ("torch/", "torchmagic/", "IPython/", "ipykernel/", "<built-in", "site-packages/",
                  "dist-packages/", "<frozen", "contextlib.py", "typing.py", "functools.py")

MAX_MATMUL_CALLS = 4096  # distinct fp32 matmul calls kept (shapes that vary every step would grow it unbounded)
MAX_BARS_PER_LANE = 1000  # the drawing is ~1000 pixels wide


@dataclass
class OpStats:
    """Totals for one operator name over the profiled steps (times in µs)."""

    name: str
    calls: int = 0
    self_cpu_us: float = 0.0
    total_cpu_us: float = 0.0
    self_device_us: float = 0.0
    flops: int = 0
    allocated_bytes: int = 0
    shapes: Counter = field(default_factory=Counter)  # shapes -> self µs, kept only when asked
    # with flops: the bytes its tensors hold (inputs read, the output written: the least traffic it
    # can have), its inputs' dtype, and FLOPs estimated (1 per element) for pointwise ops torch does not count
    bytes: int = 0
    dtype: str | None = None
    estimated_flops: int = 0
    # with flops, for an op with counted FLOPs: the device time of the kernels its calls launched, its
    # children's included (aten::convolution's FLOPs run in the kernels aten::cudnn_convolution launches)
    flop_device_us: float = 0.0

    def top_shapes(self, n: int = 2) -> list[str]:
        return [s for s, _ in self.shapes.most_common(n)]


@dataclass
class TraceSummary:
    """Everything the rules and the report need, as plain numbers (µs, bytes, counts)."""

    event_count: int = 0
    step_us: list[float] = field(default_factory=list)
    step_start_us: list[float] = field(default_factory=list)
    ops: dict[str, OpStats] = field(default_factory=dict)
    category_us: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    device_category_us: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    # dispatch: ops called straight from Python (no op above them), outside data/backward/optimizer
    python_ops: int = 0
    python_op_us: list[float] = field(default_factory=list)
    # ... in call order per thread, and beside each: its autograd sequence number (the graph node it made,
    # or where it made none the next node's; -1 outside grad mode), whether it read a value to the host,
    # and the Python time after it until the next such op (what regions.py splits a step by)
    python_op_nodes: list[int] = field(default_factory=list)
    python_op_sync: list[bool] = field(default_factory=list)
    python_gap_us: list[float] = field(default_factory=list)
    # syncs: host reads of tensor values outside data loading
    sync_calls: int = 0
    # with Python stacks: the library call the user's code made around them ("pkg/mod.py(12): fn" -> count)
    syncs_in_library: Counter = field(default_factory=Counter)
    python_ops_in_library: Counter = field(default_factory=Counter)
    sync_us: float = 0.0
    sync_runtime_calls: int = 0
    sync_runtime_us: float = 0.0
    # device-to-host copies outside a sync op (.cpu(), .to("cpu"), .tolist()): the host waits for the GPU
    device_read_calls: int = 0
    device_read_us: float = 0.0
    # copies
    copy_us: float = 0.0
    layout_copies: int = 0
    pageable_h2d: int = 0
    pageable_h2d_us: float = 0.0  # the device's time in those copies
    # matmul/conv time by precision (self CPU µs on CPU traces, device µs on GPU traces)
    matmul_fp32_us: float = 0.0
    matmul_fp32_calls: int = 0
    # each distinct fp32 matmul/conv call (op, shapes, arguments) -> [calls, self CPU µs, GPU µs, calls in the
    # forward]: what the amp rule re-times in 16 bits on this device (core/measure/low_precision.py)
    fp32_matmuls: dict[OpCall, list[float]] = field(default_factory=dict)
    matmul_low_us: float = 0.0
    matmul_fp32_device_us: float = 0.0
    matmul_fp32_device_calls: int = 0  # fp32 matmul/conv calls whose kernels are in the trace
    matmul_low_device_us: float = 0.0
    # 16-bit matmuls with a dimension off the tensor cores' grain (not a multiple of 8): their kernel time
    misaligned_matmul_device_us: float = 0.0
    misaligned_shapes: Counter = field(default_factory=Counter)  # "MxKxN" or "conv 3→64" -> kernel µs
    # every kernel's (and copy's) duration, and the time from its launch call's return to its start
    kernel_us: list[float] = field(default_factory=list)
    launch_delay_us: list[float] = field(default_factory=list)
    # autograd: sequence numbers of graph nodes created outside backward (one per recorded op)
    graph_nodes: set = field(default_factory=set)
    graph_node_us: dict = field(default_factory=dict)  # node -> µs of the ops called from Python that made it
    backward_nodes: set = field(default_factory=set)   # forward nodes a backward function ran for
    backward_events: int = 0
    # optimizer
    optimizer_us: float = 0.0
    optimizer_ops: int = 0
    optimizer_foreach: bool = False   # multi-tensor ops (_foreach_*): one kernel per op on a GPU, a loop on the CPU
    optimizer_fused: bool = False     # one fused kernel for the whole update (_fused_adamw_ ...)
    optimizer_names: set = field(default_factory=set)
    # data loading: CPU time in DataLoader __next__, and the part of it the device sat idle
    data_us: float = 0.0
    data_exposed_us: float | None = None
    # device (CUDA traces)
    has_device_events: bool = False
    device_busy_us: float = 0.0
    device_kernels: int = 0
    # ops in the steps that put work on the device when their tensors live there: those called from
    # Python, a phase or a user range (not from another op), less views, allocations and data loading
    launching_ops: int = 0
    # memory (profile_memory)
    memory_recorded: bool = False
    peak_allocated: dict[str, int] = field(default_factory=dict)   # device -> peak bytes above start
    allocated_total: dict[str, int] = field(default_factory=dict)  # device -> bytes allocated
    allocated_net: dict[str, int] = field(default_factory=dict)    # device -> bytes still held at the end
    # the user's innermost functions (python tracer): frame -> inclusive µs of the ops they called
    hot_lines: Counter = field(default_factory=Counter)
    timeline: list[Span] = field(default_factory=list)
    # one-time costs inside the steps (kineto.one_time_cost's kinds -> µs): kept out of the steady state
    one_time_us: dict[str, float] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.step_us)

    @property
    def total_step_us(self) -> float:
        return sum(self.step_us)

    @property
    def steady_step_us(self) -> float:
        """The steps' time less their one-time costs: what the rules judge shares of."""
        return max(self.total_step_us - sum(self.one_time_us.values()) - self.profiler_start_us, 0.0)

    @property
    def profiler_start_us(self) -> float:
        """On a GPU, what the first profiled step took beyond the others' median (less one-time costs
        found in it): the profiler starting to trace kernels.  In all five traces captured on an H200
        (torch 2.11, benchmarks/gpu_capture.py) the first of four steps took 1.1-2.5x the others'
        median; counted, it read an fp32 training step as 40% GPU-idle, where CUDA events timed the
        unprofiled step at 3.62 ms with 3.60 ms of kernels.  A step within 20% of the median is noise."""
        if not self.has_device_events or len(self.step_us) < 3:
            return 0.0
        typical = statistics.median(self.step_us[1:])
        if self.step_us[0] <= 1.2 * typical:
            return 0.0
        return max(self.step_us[0] - typical - sum(self.one_time_us.values()), 0.0)


class _Ev:
    """A raw event reduced to what every event needs; the rest is read from ``raw`` on demand
    (each read of a kineto event attribute costs ~0.4 µs, the main cost of the analysis)."""

    # cats: self µs by category under a timeline bar (set on bars only)
    __slots__ = ("name", "start", "end", "tid", "corr", "kind", "raw", "cats")

    def __init__(self, name, start, end, tid, kind, raw, corr=0):
        self.name, self.start, self.end, self.tid = name, start, end, tid
        self.kind, self.raw, self.corr = kind, raw, corr


# event kinds
_OP, _ANNOTATION, _PYTHON, _RUNTIME, _MEMORY = range(5)
_CPU_KINDS = {CPU_OP: _OP, USER_ANNOTATION: _ANNOTATION, PYTHON_FUNCTION: _PYTHON}


def summarize_trace(events, trace_start_ns: int, *, shapes: bool = False, flops: bool = False,
                    python_calls=()) -> TraceSummary:
    """Build the summary from kineto's raw events (``prof.profiler.kineto_results.events()``), and
    the Python tracer's calls where this torch keeps them apart (``activity.python_calls``)."""
    # ~100k short-lived records, none in a cycle: the cyclic GC's passes would only cost time
    with gc_paused():
        return _summarize(events, trace_start_ns, shapes, flops, python_calls)


def _summarize(events, trace_start_ns: int, shapes: bool, flops: bool, python_calls) -> TraceSummary:
    out = TraceSummary()
    cpu, device = _split(events, trace_start_ns, out)
    for name, start_ns, end_ns, tid in python_calls:
        out.event_count += 1
        start = (start_ns - trace_start_ns) / 1000.0
        cpu.append(_Ev(name, start, start + (end_ns - start_ns) / 1000.0, tid, _PYTHON, None))
    if device:
        _link_runtime_threads(cpu)
    by_thread: dict[int, list[_Ev]] = defaultdict(list)
    for ev in cpu:
        by_thread[ev.tid].append(ev)
    markers = sorted((ev for ev in cpu if ev.kind == _ANNOTATION and ev.name.startswith(STEP_PREFIX)),
                     key=lambda ev: ev.start)
    out.step_us = [ev.end - ev.start for ev in markers]
    out.step_start_us = [ev.start for ev in markers]
    windows = [(ev.start, ev.end) for ev in markers]
    main_tid = markers[0].tid if markers else None
    sweep = _Sweep(out, windows, {id(ev): i for i, ev in enumerate(markers)}, shapes=shapes, flops=flops)
    sweep.first_launches = _first_launches(device)
    sweep.device_reads = {ev.raw.correlation_id() for ev in device if "DtoH" in ev.name} - {0}  # 0: no id
    for tid, evs in by_thread.items():
        sweep.run(evs, "CPU main thread" if tid == main_tid else f"CPU thread {tid}")
    _discount_waiting(out, sweep, windows)
    _memory_levels(out, sweep.memory, windows)
    _attribute_device(device, out, sweep, windows)
    _bound_timeline(out)
    return out


def _split(events, trace_start_ns, out):
    """Convert raw events to light records (µs since trace start), CPU and device apart."""
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
        kind = _CPU_KINDS.get(activity)
        if kind is None:
            if activity in DEVICE_ACTIVITIES:
                start = (e.start_ns() - t0) / 1000.0
                device.append(_Ev(name, start, start + e.duration_ns() / 1000.0, e.device_resource_id(),
                                  _OP, e, e.linked_correlation_id()))
                continue
            if name == "[memory]":
                start = (e.start_ns() - t0) / 1000.0
                cpu.append(_Ev(name, start, start, e.start_thread_id(), _MEMORY, e))
                continue
            if not is_runtime(activity):
                continue  # profiler overhead markers, GPU-side annotations, sync records
            kind = _RUNTIME  # a CUDA/HIP runtime or driver call, linked to the op that made it
        if name in _SKIPPED_NAMES or e.is_async() or is_hidden(e):
            continue
        start = (e.start_ns() - t0) / 1000.0
        ev = _Ev(name, start, start + e.duration_ns() / 1000.0, e.start_thread_id(), kind, e)
        if kind == _RUNTIME:
            ev.corr = e.linked_correlation_id()
        cpu.append(ev)
    return cpu, device


def _first_launches(device: list[_Ev]) -> set[int]:
    """The CUPTI correlation ids of each kernel's first launch in the trace."""
    first: dict[str, int] = {}
    for ev in sorted(device, key=lambda ev: ev.start):
        first.setdefault(ev.name, ev.raw.correlation_id())
    return set(first.values()) - {0}  # 0: no id


def _link_runtime_threads(cpu: list[_Ev]) -> None:
    """Join runtime calls to their op's thread (CUPTI reports OS thread ids), and give ops
    their correlation ids, which only matter when there are kernels to attribute.  Unlinked
    calls (a bare torch.cuda.synchronize()) go to the thread their OS thread was seen to be."""
    corr_tid = {}
    for ev in cpu:
        if ev.kind == _OP:
            ev.corr = ev.raw.correlation_id()
            corr_tid[ev.corr] = ev.tid
    runtime = [ev for ev in cpu if ev.kind == _RUNTIME]
    os_thread = {ev.tid: corr_tid[ev.corr] for ev in runtime if ev.corr in corr_tid}
    for ev in runtime:
        ev.tid = corr_tid.get(ev.corr) or os_thread.get(ev.tid, ev.tid)


@functools.lru_cache(maxsize=4096)
def _phase_of(name: str) -> str | None:
    """The phase an event opens (cached: a trace repeats a few hundred names)."""
    for prefix, phase in _PHASE_PREFIXES:
        if name.startswith(prefix):
            return phase
    if is_compile(name):
        return START_UP
    return BACKWARD if is_backward_node(name) else None


@functools.lru_cache(maxsize=4096)
def is_user_frame(name: str) -> bool:
    """A frame of the user's own code: not torch's, torchmagic's, the standard library's or an installed
    package's (the tracer writes installed files relative to their sys.path entry: transformers/...)."""
    if any(marker in name for marker in _NOT_USER_CODE):
        return False
    top = _top_module(name)
    return top not in sys.stdlib_module_names and not installed_package(top)


@functools.lru_cache(maxsize=4096)
def is_library_frame(name: str) -> bool:
    """A Python frame of an installed third-party package (not torch's own, not a C builtin)."""
    if name.startswith("<") or any(marker in name for marker in _NOT_USER_CODE if marker != "site-packages/"
                                   and marker != "dist-packages/"):
        return False
    return "site-packages/" in name or "dist-packages/" in name or installed_package(_top_module(name))


def _top_module(name: str) -> str:
    return name.replace("\\", "/").split("/", 1)[0].split("(", 1)[0].removesuffix(".py")


@functools.lru_cache(maxsize=1024)
def installed_package(top: str) -> bool:
    """Whether a top-level module is installed into site-packages (or dist-packages), found without importing it."""
    if not top.isidentifier():
        return False
    try:
        spec = importlib.util.find_spec(top)
    except Exception:  # noqa: BLE001 - an imported module's spec is whatever its package made it
        return False
    if spec is None:
        return False
    # transformers 5 puts PosixPath objects in its __path__: read every location as a path, not a str
    where = [spec.origin or "", *(str(p) for p in spec.submodule_search_locations or ())]
    return any("site-packages" in w or "dist-packages" in w for w in where)


def _category(kind, name, phase, in_sync, in_copy) -> str:
    if phase is not None:
        return phase
    if in_sync or (kind == _RUNTIME and name in SYNC_RUNTIME):
        return SYNCS
    if in_copy:
        return COPIES
    if kind in (_OP, _RUNTIME):
        return FORWARD
    return OTHER  # Python between ops, and user annotations' own time


def _matmul_precision(raw) -> str | None:
    dtypes = raw.dtypes()
    if not dtypes:
        return None
    if dtypes[0] in LOW_PRECISION_DTYPES:
        return "low"
    return "fp32" if dtypes[0] == "float" else None


def _op_call(ev: _Ev) -> OpCall:
    raw = ev.raw
    concrete = getattr(raw, "concrete_inputs", None)
    shapes = freeze(raw.shapes())
    return OpCall(ev.name, shapes, freeze(raw.dtypes()),
                  freeze(concrete()) if concrete is not None else (None,) * len(shapes))


def _window_of(windows: list[tuple[float, float]], t: float) -> int | None:
    i = bisect.bisect_right(windows, (t, math.inf)) - 1
    return i if i >= 0 and windows[i][0] <= t < windows[i][1] else None


class _Sweep:
    """The per-thread pass: a stack of open events, each with the context its children inherit."""

    def __init__(self, out: TraceSummary, windows, marker_index: dict[int, int], *, shapes: bool, flops: bool):
        self.out = out
        self.shapes = shapes
        self.windows = windows
        self.marker_index = marker_index
        self.op_of_corr: dict[int, tuple[str, str, str | None]] = {}  # corr -> (op, category, precision)
        # CUPTI correlation id of a launch no op encloses -> (its innermost user range or None, category)
        self.launches: dict[int, tuple[str | None, str]] = {}
        self.memory: list[tuple[float, str, int]] = []  # (time, device, bytes) of each allocation/free
        self.misaligned: dict[int, str] = {}   # op's correlation id -> "MxKxN" of a 16-bit matmul off tensor cores' grain
        self.launch_end: dict[int, float] = {}  # CUPTI correlation id -> when the launch call returned
        self.launched_in_step: dict[int, bool] = {}  # CUPTI correlation id of a runtime call -> made in a step
        self.bars: dict[str, list[tuple[float, float]]] = defaultdict(list)  # lane -> top-level intervals
        self.data_intervals: list[tuple[float, float]] = []
        self.main_lane = "CPU main thread"
        self.last_python: tuple[int, float, int] | None = None  # (index, end, step) of the thread's last Python op
        self.gaps: list[tuple[int, float, float]] = []  # (index of a Python op, start, end) of the Python after it
        self.one_time: dict[int, str] = {}  # id() of a runtime call that is a one-time cost -> its kind
        self.first_launches: set[int] = set()  # CUPTI correlation ids of each kernel's first launch
        self.device_reads: set[int] = set()  # ... of device-to-host copies
        self.op_calls: Counter = Counter()  # op name -> calls opened so far
        self.flop_counts = FlopAttribution() if flops else None  # --flops (flops.py)
        self.fp32_call_of_corr: dict[int, OpCall] = {}  # an fp32 matmul's correlation id -> its call

    def run(self, evs: list[_Ev], lane: str) -> None:
        out = self.out
        self.last_python = None
        evs.sort(key=lambda ev: (ev.start, -ev.end))
        # An open event: [ev, child_us, phase, in_sync, in_copy, step, top, frame, under_op, library]
        stack: list[list] = []
        for ev in evs:
            while stack and stack[-1][0].end <= ev.start:
                self._close(stack.pop(), lane)
            parent = stack[-1] if stack else None
            if ev.kind == _MEMORY:
                self._memory(ev, parent)
                continue
            name, kind = ev.name, ev.kind
            if parent is None:
                phase, in_sync, in_copy, step, top, frame, under_op, library = (None, False, False, None, None, None,
                                                                                 False, None)
            else:
                parent[1] += ev.end - ev.start
                _, _, phase, in_sync, in_copy, step, top, frame, under_op, library = parent
            marker = self.marker_index.get(id(ev))
            if marker is not None:
                step, top = marker, None
            elif parent is None:
                step = _window_of(self.windows, ev.start)  # work on other threads, placed by time
                top = ev if step is not None else None
            elif top is None and step is not None:
                top = ev  # a direct child of the step marker
            if top is ev:
                ev.cats = {}
            own_phase = _phase_of(name)
            if own_phase is not None:
                self.last_python = None  # the time until the next Python op is this phase's, not Python's
            if own_phase is not None and (phase is None or own_phase == START_UP):  # a compile inside any phase
                phase = own_phase
                if own_phase == BACKWARD:
                    out.backward_events += 1
                elif own_phase == OPTIMIZER and kind == _ANNOTATION:
                    out.optimizer_names.add(name.split("#", 1)[1].split(".", 1)[0])
                elif own_phase == DATA and step is not None:
                    self.data_intervals.append((ev.start, ev.end))
            if self.flop_counts is not None:
                self.flop_counts.opened(ev, parent[0] if parent is not None else None, ev.kind == _OP)
            if kind == _PYTHON and is_user_frame(name):
                frame, library = name, None
            elif kind == _PYTHON and frame is not None and library is None and is_library_frame(name):
                library = name  # the library call the user's code made: a loop of its own may be in there
            if kind == _OP:
                self.op_calls[name] += 1
                # a sync or copy the user asked for, not one inside another op's implementation
                in_sync = in_sync or (name in SYNC_OPS and not under_op)
                in_copy = in_copy or (name in COPY_OPS and not under_op)
                if step is not None:
                    self._op_opened(ev, step, phase, frame, under_op, library)
            elif kind == _RUNTIME:
                corr = ev.raw.correlation_id()
                if name in LAUNCH_CALLS:
                    self.launch_end[corr] = ev.end
                if corr:
                    self.launched_in_step[corr] = step is not None
                if corr in self.device_reads and not in_sync:
                    # a copy to the host (.cpu(), .tolist(), print) waits for the GPU to get there: a sync
                    in_sync = True
                    if step is not None and phase is None:
                        out.device_read_calls += 1
                        out.device_read_us += ev.end - ev.start
                if ev.end - ev.start >= START_UP_MIN_US:
                    self._one_time(ev, parent)
                if step is not None and name in SYNC_RUNTIME and phase is None and not in_sync:
                    out.sync_runtime_calls += 1  # explicit torch.cuda.synchronize() and friends
                    out.sync_runtime_us += ev.end - ev.start
                if step is not None and not under_op:
                    self._launch_outside_ops(ev, stack, _category(kind, name, phase, in_sync, in_copy))
            stack.append([ev, 0.0, phase, in_sync, in_copy, step, top, frame, under_op or kind == _OP, library])
        while stack:
            self._close(stack.pop(), lane)

    def _one_time(self, ev: _Ev, parent) -> None:
        """Mark a slow runtime call that is a one-time cost (kineto.one_time_cost)."""
        op = parent[0] if parent is not None and parent[0].kind == _OP else None
        kind = one_time_cost(ev.name, ev.end - ev.start, op is not None and self.op_calls[op.name] == 1,
                             ev.name in LAUNCH_CALLS and ev.raw.correlation_id() in self.first_launches)
        if kind is not None:
            self.one_time[id(ev)] = kind

    def _launch_outside_ops(self, ev: _Ev, stack: list[list], category: str) -> None:
        """A runtime call no op encloses (a custom extension's or a hand-written Triton kernel's launch
        under record_function): kineto links kernels to ops only, so remember the launch's innermost
        user range and category for its kernels, found by CUPTI's correlation id that they share."""
        corr = ev.raw.correlation_id()
        if corr:
            user_range = next((entry[0].name for entry in reversed(stack)
                               if entry[0].kind == _ANNOTATION and id(entry[0]) not in self.marker_index), None)
            self.launches[corr] = (user_range, category)

    def _op_opened(self, ev: _Ev, step: int, phase, frame, under_op, library) -> None:
        out, name, dur = self.out, ev.name, ev.end - ev.start
        if not under_op and phase != DATA and name not in NO_KERNEL_OPS:
            out.launching_ops += 1
        backward_node = phase == BACKWARD and is_backward_node(name)
        seq = ev.raw.sequence_nr() if phase is None or backward_node else -1
        if phase is None and not under_op:  # called straight from Python
            if self.last_python is not None and self.last_python[2] == step and ev.start > self.last_python[1]:
                self.gaps.append((self.last_python[0], self.last_python[1], ev.start))
            self.last_python = (len(out.python_op_us), ev.end, step)
            out.python_ops += 1
            out.python_op_us.append(dur)
            out.python_op_nodes.append(seq)
            out.python_op_sync.append(name in SYNC_OPS)
            out.python_gap_us.append(0.0)
            if frame is not None:
                out.hot_lines[frame] += dur
            if library is not None:
                out.python_ops_in_library[library] += 1
            if name in SYNC_OPS:
                out.sync_calls += 1
                out.sync_us += dur
                if library is not None:
                    out.syncs_in_library[library] += 1
        if phase is None:
            if seq >= 0:
                out.graph_nodes.add(seq)
                if not under_op:
                    out.graph_node_us[seq] = out.graph_node_us.get(seq, 0.0) + dur
        elif backward_node:
            # seq: the forward node this backward function computes the gradient of
            if seq >= 0:
                out.backward_nodes.add(seq)
        if phase == OPTIMIZER:
            out.optimizer_ops += 1
            if "_fused_" in name:
                out.optimizer_fused = True
            elif "_foreach_" in name:
                out.optimizer_foreach = True
        if name == "aten::contiguous":
            out.layout_copies += 1

    def _close(self, entry, lane: str) -> None:
        ev, child_us, phase, in_sync, in_copy, step, top, _, _, _ = entry
        flops = self.flop_counts.closed(ev) if self.flop_counts is not None else 0
        if step is None:
            return  # outside the profiled steps (profiler start and stop)
        out, name, kind = self.out, ev.name, ev.kind
        dur = ev.end - ev.start
        self_us = max(dur - child_us, 0.0)
        is_step = top is None  # only a step marker has a step but no bar above it
        one_time = self.one_time.get(id(ev)) if kind == _RUNTIME else None
        if one_time is not None:
            category = START_UP
        else:
            category = OTHER if is_step else _category(kind, name, phase, in_sync, in_copy)
            one_time = FIRST_COMPILE if category == START_UP else None
        if one_time is not None:
            out.one_time_us[one_time] = out.one_time_us.get(one_time, 0.0) + self_us
        out.category_us[category] += self_us
        if top is not None:
            top.cats[category] = top.cats.get(category, 0.0) + self_us
            if top is ev:
                dominant = max(ev.cats, key=ev.cats.get)
                out.timeline.append(Span(lane, ev.start, dur, dominant, name))
                self.bars[lane].append((ev.start, ev.end))
        if kind == _PYTHON or is_step:
            return
        if category == OPTIMIZER:
            out.optimizer_us += self_us
        elif category == DATA:
            out.data_us += self_us
        elif category == COPIES:
            out.copy_us += self_us
        stats = out.ops.get(name)
        if stats is None:
            stats = out.ops[name] = OpStats(name)
        stats.calls += 1
        stats.self_cpu_us += self_us
        stats.total_cpu_us += dur
        if kind != _OP:
            return
        precision = _matmul_precision(ev.raw) if name in MATMUL_OPS else None
        if precision == "low":
            out.matmul_low_us += self_us
            shape = off_tensor_core_grain(name, ev.raw.shapes()) if ev.corr else None
            if shape is not None:
                self.misaligned[ev.corr] = shape
        elif precision == "fp32":
            out.matmul_fp32_us += self_us
            out.matmul_fp32_calls += 1
            call = _op_call(ev)
            totals = out.fp32_matmuls.get(call)
            if totals is None and len(out.fp32_matmuls) < MAX_MATMUL_CALLS:
                totals = out.fp32_matmuls[call] = [0, 0.0, 0.0, 0]
            if totals is not None:
                totals[0] += 1
                totals[1] += self_us
                totals[3] += category == FORWARD
                if ev.corr:
                    self.fp32_call_of_corr[ev.corr] = call
        if ev.corr:
            self.op_of_corr[ev.corr] = (name, category, precision)
        if self.flop_counts is not None:
            stats.flops += flops
            moved, dtype, pointwise_flops = tensor_traffic(name, ev.raw.shapes(), ev.raw.dtypes())
            stats.bytes += moved
            stats.dtype = stats.dtype or dtype
            stats.estimated_flops += pointwise_flops
        if self.shapes:
            stats.shapes[_shape_text(ev.raw.shapes())] += self_us

    def _memory(self, ev: _Ev, parent) -> None:
        out = self.out
        out.memory_recorded = True
        device_type = ev.raw.device_type()
        # per device, never summed across GPUs: "cuda:1", as a Device's label reads
        device = ("cpu" if device_type == DeviceType.CPU
                  else f"{str(device_type).rsplit('.', 1)[-1].lower()}:{max(ev.raw.device_index(), 0)}")
        nbytes = ev.raw.nbytes()
        self.memory.append((ev.start, device, nbytes))
        if nbytes > 0 and _window_of(self.windows, ev.start) is not None:
            out.allocated_total[device] = out.allocated_total.get(device, 0) + nbytes
            if parent is not None and parent[0].kind == _OP:
                stats = out.ops.get(parent[0].name)
                if stats is None:
                    stats = out.ops[parent[0].name] = OpStats(parent[0].name)
                stats.allocated_bytes += nbytes


def _memory_levels(out: TraceSummary, records: list[tuple[float, str, int]], windows) -> None:
    """Peak and final allocation level per device above the first step's start, in time order across
    threads: on CUDA, backward allocates on the autograd thread while the main thread's tensors live.
    Memory may be recorded from before the steps (run.py starts the profiler a warm-up step early: the
    CPU profiler reports no free of a block allocated before it started, so the gradients zero_grad
    frees would otherwise never leave the level); only the steps' records make the peak."""
    if not windows:
        return
    level: dict[str, int] = defaultdict(int)
    base: dict[str, int] = {}
    start, end = windows[0][0], windows[-1][1]
    for t, device, nbytes in sorted(records, key=lambda r: r[0]):
        if t > end:
            break
        if t >= start:
            base.setdefault(device, level[device])
        level[device] += nbytes
        if t >= start:
            out.peak_allocated[device] = max(out.peak_allocated.get(device, 0), level[device] - base[device])
    out.allocated_net = {device: level[device] - base[device] for device in base}


def _discount_waiting(out: TraceSummary, sweep: _Sweep, windows) -> None:
    """The main thread's gaps count as Python ("other") unless another thread worked meanwhile:
    on CUDA, backward runs on an autograd thread while the main thread waits for it.  The same holds
    for the Python time after each op called from Python."""
    others = union(iv for lane, ivs in sweep.bars.items() if lane != sweep.main_lane for iv in ivs)
    for index, start, end in sweep.gaps:
        out.python_gap_us[index] += end - start - (overlap([(start, end)], near(others, start, end)) if others else 0.0)
    if not others:
        return
    gaps = list(subtract(union(windows), union(sweep.bars.get(sweep.main_lane, []))))
    out.category_us[OTHER] = max(out.category_us[OTHER] - overlap(gaps, others), 0.0)


def _shape_text(shapes) -> str:
    return ", ".join(f"[{', '.join(map(str, s))}]" if isinstance(s, list) else str(s) for s in shapes if s != [])


def _attribute_device(device: list[_Ev], out: TraceSummary, sweep: _Sweep, windows) -> None:
    """Give each kernel/memcpy to the op that launched it, or where no op did, to the user range
    around its launch; measure the device time of the steps: the union of the kernels the steps
    launched, wherever they ran (a host ahead of its GPU leaves the last steps' kernels running after
    the profiled window), and where the launch is not in the trace, of the kernels run inside the steps."""
    if not device:
        return
    out.has_device_events = True
    intervals, launched_in_steps, unlinked = [], [], []
    fp32_calls = set()
    for ev in device:
        dur = ev.end - ev.start
        op, category, precision = sweep.op_of_corr.get(ev.corr, (None, OTHER, None))
        if op is None and sweep.launches:
            op, category = sweep.launches.get(ev.raw.correlation_id(), (None, OTHER))
        if op is not None:
            stats = out.ops.get(op)
            if stats is None:
                stats = out.ops[op] = OpStats(op)
            stats.self_device_us += dur
        owner = sweep.flop_counts.owner_of_corr.get(ev.corr) if sweep.flop_counts is not None else None
        if owner is not None and owner in out.ops:
            out.ops[owner].flop_device_us += dur
        if precision == "low":
            out.matmul_low_device_us += dur
            shape = sweep.misaligned.get(ev.corr)
            if shape is not None:
                out.misaligned_matmul_device_us += dur
                out.misaligned_shapes[shape] += dur
        elif precision == "fp32":
            out.matmul_fp32_device_us += dur
            fp32_calls.add(ev.corr)
            call = sweep.fp32_call_of_corr.get(ev.corr)
            if call is not None:
                out.fp32_matmuls[call][2] += dur
        out.kernel_us.append(dur)
        launched = sweep.launch_end.get(ev.raw.correlation_id())
        if launched is not None:
            out.launch_delay_us.append(max(ev.start - launched, 0.0))
        out.device_category_us[category] += dur
        out.device_kernels += 1
        if "HtoD" in ev.name and "Pageable" in ev.name:
            out.pageable_h2d += 1
            out.pageable_h2d_us += dur
        intervals.append((ev.start, ev.end))
        in_step = sweep.launched_in_step.get(ev.raw.correlation_id() or None)
        if in_step:
            launched_in_steps.append((ev.start, ev.end))
        elif in_step is None:  # its runtime call is not in the trace
            unlinked.append((ev.start, ev.end))
        out.timeline.append(Span(f"GPU stream {ev.tid}", ev.start, dur, category, ev.name))
    out.matmul_fp32_device_calls = len(fp32_calls)
    busy = union(intervals)
    steps_busy = union(launched_in_steps + list(intersection(union(unlinked), union(windows))))
    out.device_busy_us = sum(end - start for start, end in steps_busy)
    data = union(sweep.data_intervals)
    out.data_exposed_us = sum(end - start for start, end in data) - overlap(data, busy)


def _bound_timeline(out: TraceSummary) -> None:
    """At most MAX_BARS_PER_LANE bars per lane, whatever the trace length: past that, bars are
    binned by time (about one bin per pixel of the drawing), each bin drawn as one bar in the
    category that took most of its time.  Every step stays on the timeline."""
    lanes: dict[str, list[Span]] = defaultdict(list)
    for span in out.timeline:
        lanes[span.lane].append(span)
    bounded: list[Span] = []
    for lane, spans in lanes.items():
        spans.sort(key=lambda s: s.start_us)
        if len(spans) <= MAX_BARS_PER_LANE:
            bounded += spans
            continue
        t0 = spans[0].start_us
        width = (max(s.start_us + s.dur_us for s in spans) - t0) / MAX_BARS_PER_LANE
        bins: dict[int, list[Span]] = defaultdict(list)
        for s in spans:
            bins[min(int((s.start_us - t0) / width), MAX_BARS_PER_LANE - 1)].append(s)
        bars: list[list] = []  # [start, end, category]
        for index in sorted(bins):
            members = bins[index]
            time_in: dict[str, float] = defaultdict(float)
            for s in members:
                time_in[s.category] += s.dur_us
            category = max(time_in, key=time_in.get)
            start = members[0].start_us
            end = max(s.start_us + s.dur_us for s in members)
            if bars and bars[-1][2] == category and start - bars[-1][1] <= width:
                bars[-1][1] = max(bars[-1][1], end)  # one bar across neighbouring bins
            else:
                bars.append([start, end, category])
        bounded += [Span(lane, start, end - start, category, "(binned)") for start, end, category in bars]
    out.timeline = bounded

