"""The summary of a profiled trace: per-operator totals and what the rules and the report read, as
plain numbers (µs, bytes, counts), built by traces/table_summary.py from a trace's columns (a file's or a live
profile's) or by hand in a test."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...core.measure.low_precision import OpCall
from .categories import CATEGORIES
from .result import TimelineSpan as Span  # a bar: a step's top-level event, or a kernel


def largest(counts: Mapping, n: int | None = None) -> list[tuple]:
    """``counts``' (key, value) pairs, largest value first, ties by key: the order every table and list of the
    report is in, whatever order the trace gave them."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


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
        return [s for s, _ in largest(self.shapes, n)]


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
    # events the profiler lost (traces/summary_device.count_lost): kernels and copies whose runtime call
    # is not in the trace, and of the kernel launches made in the steps, those whose kernel is not
    kernels_without_launch: int = 0
    kernel_launches: int = 0
    launches_without_kernel: int = 0
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
