"""The result of ``%%torchprofile`` / ``torchmagic.profile``: plain data, renderable without a kernel."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from ...core.devices import DeviceInfo
from ...core.expectations import Expectation
from ...core.render.base import Result
from .options import SORT_KEYS, ProfileOptions
from .verify_result import VerifyResult

class Severity(str, Enum):
    """How much of the step a finding's fix could win back, most first: its value is what JSON, the
    text report ([high]) and the HTML's CSS class show."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    # the value, on every Python: 3.12 made format() of a mixed-in enum its str(), "Severity.HIGH"
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def rank(self) -> int:
        """0 for the most severe: findings sort by it."""
        return list(Severity).index(self)


@dataclass(frozen=True)
class Finding:
    """One diagnosed bottleneck: what, how sure and how big, the fix, and how to verify it."""

    rule: str
    severity: Severity
    title: str
    evidence: dict[str, Any]
    fix: str
    snippet: str
    verify: str | None = None
    share: float = 0.0       # share of the step the rule's evidence accounts for
    # the step's speedup the fix is predicted to bring on this machine, and what that rests on; the
    # verify command carries it (--expect) and says whether what it measures falls inside
    expected: Expectation | None = None

    def __post_init__(self):
        # "high" as written by hand or by an older file: the type, so that findings sort by its rank
        object.__setattr__(self, "severity", Severity(self.severity))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class OpRow:
    name: str
    calls: int
    self_cpu_us: float
    total_cpu_us: float
    self_device_us: float = 0.0
    flops: int = 0
    allocated_bytes: int = 0
    shapes: tuple[str, ...] = ()
    bytes: int = 0                  # --flops: what its tensors hold (inputs, and a matmul's or pointwise op's output)
    dtype: str | None = None        # --flops: its first input's dtype, as the trace writes it
    estimated_flops: int = 0        # --flops: 1 per element of a pointwise op (FlopCounterMode counts matmuls, convs, attention)
    flop_device_us: float = 0.0     # --flops: device time of the kernels an op with counted FLOPs launched, its children's too


@dataclass(frozen=True)
class TimelineSpan:
    lane: str
    start_us: float
    dur_us: float
    category: str
    name: str


@dataclass(frozen=True)
class RooflineRow:
    """One operator on the measured roofline (``--flops``), totals over the profiled steps."""

    name: str
    dtype: str                      # float32, bfloat16, float16: whose compute roof applies
    flops: int                      # FlopCounterMode's count (matmul, conv, attention), or the pointwise estimate
    bytes: int
    intensity: float                # FLOPs per byte
    achieved_flops_per_s: float     # over the time of its work: its calls' GPU kernels where it has them, else CPU
                                    # time (an op with counted FLOPs: its children's included, where its kernels run)
    bound: str                      # "compute" or "memory": which side of the ridge its intensity is on
    fraction_of_roof: float         # achieved / the roof at its intensity
    estimated: bool = False         # FLOPs estimated (pointwise), not counted by a formula


@dataclass(frozen=True)
class Allocation:
    """One allocation alive at the peak (``--memory``)."""

    bytes: int
    op: str | None               # the innermost torch op around it (None: made from Python directly)
    stack: tuple[str, ...]       # the user's frames, innermost first (library frames left out)
    device: str
    at_s: float                  # when, in seconds from the first profiled step's start
    module: str | None = None    # the innermost module whose forward made it ("MultiheadAttention_0")


@dataclass
class ProfileResult(Result):
    """What one profiling run measured and concluded.  Times in seconds unless named ``_us``."""

    label: str
    device: DeviceInfo
    step_s: list[float]                       # wall time of each profiled step (device synchronised)
    warmup_s: list[float] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    ops: list[OpRow] = field(default_factory=list)
    categories_s: dict[str, float] = field(default_factory=dict)         # CPU self time by category
    device_categories_s: dict[str, float] = field(default_factory=dict)  # kernel time by category
    overhead: float | None = None             # profiled / un-profiled step time (Hodges-Lehmann), where it has
    overhead_ci: tuple[float, float] | None = None  # ... a 95% interval (stats.unpaired_ratio): 4 runs a side
    notes: list[str] = field(default_factory=list)
    # host memory the process took while the profiler ran, before it stopped (malloc's bytes in use, else the
    # resident size; budget.py); the stop then takes several times that to read the events
    capture_bytes: int | None = None
    # GPU: kernels whose launch is not in the trace, and kernel launches whose kernel is not: events the
    # profiler lost (a profiler started again in one process loses some, pytorch#192021)
    kernels_without_launch: int = 0
    launches_without_kernel: int = 0
    timeline: list[TimelineSpan] = field(default_factory=list)
    step_starts_us: list[float] = field(default_factory=list)  # on the timeline's clock
    memory_peak_bytes: dict[str, int] = field(default_factory=dict)
    memory_allocated_bytes: dict[str, int] = field(default_factory=dict)
    # --memory: per device, (seconds from the first step's start, bytes allocated above the profile's start,
    # bytes reserved (CUDA) or None); and the largest allocations alive at the peak, with who made them
    memory_timeline: dict[str, list[tuple[float, int, int | None]]] = field(default_factory=dict)
    largest_allocations: list[Allocation] = field(default_factory=list)
    # --flops: the device's peaks, measured here (matmul FLOP/s per dtype, copy bytes/s), each heavy op
    # on the roofline they make, and the step's model FLOPs utilisation against the peak of its main dtype
    peak_flops_per_s: dict[str, float] = field(default_factory=dict)
    peak_bytes_per_s: float | None = None
    roofline: list[RooflineRow] = field(default_factory=list)
    mfu: float | None = None
    # GPU: kernels per step, their median µs, the share of them (and of kernel time) under 10 µs, and the
    # median µs from a launch call's return to its kernel's start
    kernel_stats: dict[str, float] = field(default_factory=dict)
    energy_j_per_step: float | None = None    # NVML's energy counter over the profiled steps (NVIDIA GPUs)
    hot_lines: list[tuple[str, float]] = field(default_factory=list)     # (source frame, op µs)
    nvml: dict[str, Any] | None = None
    trace_path: str | None = None
    event_count: int = 0
    analysis_s: float = 0.0
    error: str | None = None                  # the cell's exception, when it raised
    options: ProfileOptions = field(default_factory=ProfileOptions)
    code: str | None = None                   # the profiled code's source (a cell's): what --verify runs as before
    verified: VerifyResult | None = None      # --verify: this code against the profiled one, and the verdict

    def _view(self):
        from . import view  # imported when first shown (it imports this module for type checking only)

        return view

    # -- derived numbers -------------------------------------------------------------
    @property
    def steps(self) -> int:
        return len(self.step_s)

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(self.step_s) if self.step_s else None

    @property
    def sort_field(self) -> str:
        key = self.options.sort
        if key == "auto":
            return "self_device_us" if any(op.self_device_us for op in self.ops) else "self_cpu_us"
        return SORT_KEYS[key]

    def sorted_ops(self) -> list[OpRow]:
        field_name = self.sort_field
        return sorted(self.ops, key=lambda op: (-getattr(op, field_name), op.name))  # ties by name

    def finding(self, rule: str) -> Finding | None:
        return next((f for f in self.findings if f.rule == rule), None)

    # -- views -----------------------------------------------------------------------
    def interrupted_line(self) -> str:
        ran, asked = len(self.step_s), self.options.steps
        if ran:
            return f"interrupted: {ran} of {asked} profiled steps ran; the profile below covers them"
        if len(self.warmup_s) < self.options.warmup:
            return "interrupted during the warm-up runs, before profiling began"
        return "interrupted before the first profiled step finished: the profile below has no full step"

    def to_dict(self) -> dict:
        data = {**asdict(self), "device": self.device.to_dict()}
        data["steps"] = self.steps
        data["median_step_s"] = self.median_step_s
        data["hot_lines"] = [list(pair) for pair in self.hot_lines]
        return data

    def __repr__(self) -> str:
        from ...core.render.format import fmt_s

        median = self.median_step_s
        step = f"{fmt_s(median)}/step" if median is not None else "no complete step"
        return (f"<ProfileResult {self.label}: {self.steps} step(s), {step}, "
                f"{len(self.findings)} finding(s){', error' if self.error else ''}>")
