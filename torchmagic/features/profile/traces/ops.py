"""One rank's operator-level report from its trace file, as ``%%torchprofile`` gives it.

The trace is read into columns as the per-rank pass reads it (columns.py), in that one reading, whatever its size
or what it holds, and summarised over them (columnar.py) as a live profile is (profile/live_columns.py): host
work, runtime calls and the device's kernels, copies and memsets, in groups of about ``GROUP_EVENTS`` events
(consecutive steps), which bounds what the summary makes besides the columns.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from ....core.devices import DeviceInfo
from ....core.devices.cuda import tensor_core_precision

from ..result import ProfileResult
from ..rules import RuleContext
from ..summary_fields import summary_fields
from ..options import ProfileOptions
from ..kineto import unread_device
from ..summary import TraceSummary
from .columnar import columnar_summary
from .columns import BatchColumns, ColumnReading, TraceColumns
from .fields import MAX_INPUTS
from .rank import RankTrace
from .reader import shown_path

GROUP_EVENTS = 300_000  # events summarised at once (a group of steps)


def trace_profile(trace: RankTrace, alongside: AlongsideReading) -> ProfileResult:
    """The operator-level report of one rank's trace, over all its steps, from what ``alongside`` read with the
    per-rank pass."""
    summary, seen = operator_summary(trace, GROUP_EVENTS, alongside)
    notes = ["Read from a trace file: a step's time is its ProfilerStep range as recorded (the device was "
             "not synchronised at its end)."]
    if seen.dropped:
        notes.append(f"Shapes and input types of {seen.dropped:,} op(s) with over {MAX_INPUTS:,} inputs were "
                     "left out (their time is counted).")
    if not seen.steps:
        notes.append("No ProfilerStep markers: the whole trace is read as one step.")
    device, context = _device(seen.meta, seen.kernels, unread_device(trace.categories))
    options = ProfileOptions(steps=len(summary.step_us),
                             record_shapes=any(stats.shapes for stats in summary.ops.values()))
    label = shown_path(os.path.basename(trace.path)) + (f" (rank {trace.rank})" if trace.rank is not None else "")
    fields = summary_fields(summary, context, len(summary.step_us), notes)
    return ProfileResult(label=label, device=device, step_s=[us / 1e6 for us in summary.step_us],
                         notes=notes, options=dataclasses.replace(options, memory=summary.memory_recorded,
                                                                  flops=any(s.flops for s in summary.ops.values())),
                         **fields)


def operator_summary(trace: RankTrace, limit: int, alongside: AlongsideReading) -> tuple[TraceSummary, Seen]:
    """The trace's summary over all its steps, in groups of about ``limit`` events, from the columns
    ``alongside`` read (let go once summarised), and what the reading saw."""
    columns = alongside.held_columns()
    flops = columns.flops or _profiled_with_flops(trace.meta)
    summary, _, _ = columnar_summary(columns, trace, limit, flops)
    seen = Seen(kernels=columns.kernels, steps=columns.steps, meta=trace.meta, dropped=alongside.dropped())
    alongside.release_columns()  # (190 MB at 1 GB, let go before the findings are made)
    return summary, seen


def _profiled_with_flops(meta: dict) -> bool:
    """Whether the file says it was profiled with FLOPs (torch 2.13 writes ``"with_flops": 1`` and no count)."""
    return meta.get("with_flops") in (1, True)


@dataclass
class Seen:
    """What the reading saw of the whole trace, besides its events."""

    kernels: bool = False
    steps: bool = False
    meta: dict = field(default_factory=dict)
    dropped: int = 0  # ops whose inputs were too many to keep


def alongside_reading(path: str) -> AlongsideReading:
    """An AlongsideReading of the trace at ``path``."""
    return AlongsideReading(path)


class AlongsideReading:
    """The operator pass's reading done as the per-rank pass reads the file (rank.read_rank's ``also``): the
    trace into columns (columns.py) in that one reading, whatever its size."""

    def __init__(self, path: str):
        self.columns = ColumnReading(path)

    def __call__(self, batch) -> None:
        """Read one of the per-rank pass's batches, once it has."""
        self.columns(batch)

    def batch_columns(self) -> BatchColumns | None:
        """The last batch as the columns read it (None where they did not): the per-rank pass reads its figures
        from these rather than from each record again."""
        return self.columns.batch

    def release_columns(self) -> None:
        """Let the columns go once they are summarised."""
        self.columns.columns = None

    def held_columns(self) -> TraceColumns:
        """The trace's columns, once the per-rank pass has read it all; what the reading refused is raised now,
        after any error of that pass's own."""
        if self.columns.refusal is not None:
            raise self.columns.refusal
        return self.columns.columns

    def dropped(self) -> int:
        """Ops whose inputs were too many to keep (their time is counted)."""
        return self.columns.dropped


def _device(meta: dict, kernels: bool, unread: str | None = None) -> tuple[DeviceInfo, RuleContext]:
    """What the trace says of its device: a GPU's name and whether it has tensor cores (from
    ``deviceProperties``); of a CPU, nothing this machine could vouch for; of an accelerator whose
    work is in categories not read here (``unread``), that it is one: the host's figures alone cannot
    say whether it waits."""
    gpus = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else []
    gpu = gpus[0] if gpus and isinstance(gpus[0], dict) else {}
    if not kernels and unread is not None:
        context = RuleContext(device_type=unread, low_precision_fast=False, low_precision_dtype=None,
                              low_precision_reason=f"the trace's {unread} work is not read", accelerator=True)
        return DeviceInfo(unread, unread, f"the trace's accelerator ({unread})"), context
    if not kernels:
        context = RuleContext(device_type="cpu", low_precision_fast=False, low_precision_dtype=None,
                              low_precision_reason="the trace does not say how fast its CPU's bf16 is")
        return DeviceInfo("cpu", "cpu", "the trace's CPU"), context
    major, minor = gpu.get("computeMajor"), gpu.get("computeMinor", 0)
    if type(major) is int and type(minor) is int and 0 <= major < 1000 and 0 <= minor < 1000:
        low = tensor_core_precision(major, minor)
        fast, dtype, reason = low.fast, str(low.dtype).removeprefix("torch."), low.reason
    else:
        fast, dtype, reason = False, None, "the trace does not say which GPU it ran on"
    context = RuleContext(device_type="cuda", low_precision_fast=fast, low_precision_dtype=dtype,
                          low_precision_reason=reason, accelerator=True, traces_kernels=True)
    name = shown_path(gpu["name"][:128]) if isinstance(gpu.get("name"), str) else "the trace's GPU"
    return DeviceInfo("cuda", "cuda", name), context
