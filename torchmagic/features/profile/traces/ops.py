"""One rank's operator-level report from its trace file, as ``%%torchprofile`` gives it.

The trace's columns (event_table.py: its one reading, from which the per-rank pass is made too) are summarised
(table_summary.py) as a live profile's are (profile/live_table.py): host work, runtime calls and the device's
kernels, copies and memsets, in groups of about ``GROUP_EVENTS`` events (consecutive steps), which bounds what the
summary makes besides the columns.
"""

from __future__ import annotations

import dataclasses
import os

from ....core.devices import DeviceInfo
from ....core.devices.cuda import tensor_core_precision

from ..result import ProfileResult
from ..rules import RuleContext
from ..summary_fields import summary_fields
from ..options import ProfileOptions
from ..kineto import unread_device
from ..summary import TraceSummary
from .table_summary import summarize_table
from .event_table import EventTable
from .fields import MAX_INPUTS
from .rank import RankTrace
from .reader import shown_path

GROUP_EVENTS = 300_000  # table rows summarised at once (a group of steps)


def trace_profile(trace: RankTrace, columns: EventTable) -> ProfileResult:
    """The operator-level report of one rank's trace, over all its steps, from its columns (let go once
    summarised: 190 MB at 1 GB, before the findings are made)."""
    summary = operator_summary(trace, columns, GROUP_EVENTS)
    kernels, steps, dropped = columns.kernels, columns.steps, columns.dropped
    del columns
    notes = ["Read from a trace file: a step's time is its ProfilerStep range as recorded (the device was "
             "not synchronised at its end)."]
    if dropped:
        notes.append(f"Shapes and input types of {dropped:,} op(s) with over {MAX_INPUTS:,} inputs were "
                     "left out (their time is counted).")
    if not steps:
        notes.append("No ProfilerStep markers: the whole trace is read as one step.")
    device, context = _device(trace.meta, kernels, unread_device(trace.categories))
    options = ProfileOptions(steps=len(summary.step_us),
                             record_shapes=any(stats.shapes for stats in summary.ops.values()))
    label = shown_path(os.path.basename(trace.path)) + (f" (rank {trace.rank})" if trace.rank is not None else "")
    fields = summary_fields(summary, context, len(summary.step_us), notes)
    return ProfileResult(label=label, device=device, step_s=[us / 1e6 for us in summary.step_us],
                         notes=notes, options=dataclasses.replace(options, memory=summary.memory_recorded,
                                                                  flops=any(s.flops for s in summary.ops.values())),
                         **fields)


def operator_summary(trace: RankTrace, columns: EventTable, limit: int) -> TraceSummary:
    """The trace's summary over all its steps, in groups of about ``limit`` of its table's rows."""
    return summarize_table(columns, limit, columns.flops or _profiled_with_flops(trace.meta))[0]


def _profiled_with_flops(meta: dict) -> bool:
    """Whether the file says it was profiled with FLOPs (torch 2.13 writes ``"with_flops": 1`` and no count)."""
    return meta.get("with_flops") in (1, True)


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
