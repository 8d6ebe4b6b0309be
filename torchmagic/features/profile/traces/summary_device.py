"""The device's events in the table summary (table_summary.py): each kernel, copy and memset given to the op (or
user range) that launched it, the device's time in the steps and what data loading left idle, and the events the
profiler lost; over a group's device events held as tensors, with what the host side told about them
(``ColumnLinks``) looked up by id rather than per event."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..categories import CATEGORIES, OTHER
from ..timeline import Bars, add_bounded
from ..summary import OpStats, TraceSummary
from ..intervals import EMPTY, as_set, intersection, overlap, total, union
from .summary_context import CATEGORY, Names

LOW, FP32 = 1, 2  # a matmul's precision codes (0: neither)
_NONE = torch.empty(0, dtype=torch.long)


@dataclass
class Keyed:
    """Values by an integer id, the last given of each id kept (as a dict keeps them), the ids sorted."""

    keys: torch.Tensor = field(default_factory=lambda: _NONE)
    values: tuple = ()

    @classmethod
    def last_of(cls, keys: torch.Tensor, *values: torch.Tensor) -> Keyed:
        order = torch.argsort(keys, stable=True)
        keys = keys[order]
        last = torch.ones(len(keys), dtype=torch.bool)
        last[:-1] = keys[1:] != keys[:-1]
        return cls(keys[last], tuple(v[order][last] for v in values))

    def find(self, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query's place among the ids (clamped) and whether it is one."""
        if not len(self.keys):
            return torch.zeros_like(query), torch.zeros(len(query), dtype=torch.bool)
        at = torch.searchsorted(self.keys, query).clamp(max=len(self.keys) - 1)
        return at, self.keys[at] == query


@dataclass
class ColumnLinks:
    """What a group's host events tell about its device events, by id: kineto links a kernel to its op by the
    op's ``External id`` (an op id here) and to its runtime call by CUPTI's correlation id."""

    ops: Keyed = field(default_factory=Keyed)  # op id -> (name id, category code, precision code)
    misaligned: dict = field(default_factory=dict)  # op id -> "MxKxN" of a 16-bit matmul off the grain
    fp32_calls: dict = field(default_factory=dict)  # op id -> its fp32 matmul's call (OpCall)
    launches: Keyed = field(default_factory=Keyed)  # CUPTI id of a launch no op encloses -> (range name id, category)
    launch_end: Keyed = field(default_factory=Keyed)  # CUPTI id -> (when the launch returned,)
    in_step: Keyed = field(default_factory=Keyed)  # CUPTI id of a runtime call -> (made in a step,)
    data: torch.Tensor = EMPTY  # data loading's intervals in the steps
    flop_owner: Keyed | None = None  # --flops: op id -> (the name id of the counted op above it,)


@dataclass
class DeviceColumns:
    """A group's device events in file order; where there are several groups, those with a CUPTI id last
    (table_summary._device)."""

    start: torch.Tensor  # µs since the trace's first event, made as the host events' are (float64)
    end: torch.Tensor
    name: torch.Tensor   # name ids (Names.names)
    stream: list         # each one's stream (tid as kept)
    external: torch.Tensor  # the launching op's id
    correlation: torch.Tensor  # CUPTI's

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class DeviceBusy:
    """A group of steps' device intervals, for the next group: all, those the steps count, and those of kernels
    without a launch in the trace that run past the group's last step (from its end)."""

    all: torch.Tensor = EMPTY
    steps: torch.Tensor = EMPTY
    after: torch.Tensor = EMPTY


def first_launches(device: DeviceColumns, first_kernels: dict[int, int]) -> torch.Tensor:
    """The CUPTI ids of this group's launches that are a kernel's first in the trace: of each kernel name no group
    before ran, its earliest event's (by start, ties in the group's order).  ``first_kernels``: name id -> its
    first launch's id, the groups' before, updated."""
    if not len(device):
        return _NONE
    order = torch.argsort(device.start, stable=True)
    names, ids = device.name[order], device.correlation[order]
    first = Keyed.last_of(names.flip(0), ids.flip(0))  # the last of the flipped: the first by start
    new = {name: corr for name, corr in zip(first.keys.tolist(), first.values[0].tolist()) if name not in first_kernels}
    first_kernels.update(new)
    return torch.tensor(sorted(set(new.values()) - {0}), dtype=torch.long)  # 0: no id


def device_reads(device: DeviceColumns, names: Names) -> torch.Tensor:
    """The CUPTI ids of the group's copies to the host (sorted)."""
    reads = names.to_host[device.name]
    return torch.unique(device.correlation[reads & (device.correlation != 0)])


def attribute(out: TraceSummary, device: DeviceColumns, links: ColumnLinks, names: Names, windows: list,
              before: DeviceBusy) -> DeviceBusy:
    """Give each device event to the op that launched it (by its ``External id``), or where no op did, to the
    innermost user range around its launch (by CUPTI's id), in that op's or launch's category (else other); add up
    its time per op, category and matmul precision, its delay after its launch returned, its bar; and measure the
    device time of the steps (``_busy_time``).  ``windows``: the steps so far; ``before``: the group before's busy
    time."""
    if not len(device) and not len(before.after):
        return DeviceBusy()
    out.has_device_events = True
    length = device.end - device.start
    at, found = links.ops.find(device.external)
    owner = torch.where(found, links.ops.values[0][at], -1) if len(links.ops.keys) else torch.full_like(at, -1)
    category = torch.where(found, links.ops.values[1][at], CATEGORY[OTHER]) if len(links.ops.keys) else \
        torch.full_like(at, CATEGORY[OTHER])
    precision = torch.where(found, links.ops.values[2][at], 0) if len(links.ops.keys) else torch.zeros_like(at)
    if len(links.launches.keys):  # a launch no op encloses: its user range's, and its category
        where, launched = links.launches.find(device.correlation)
        launched &= ~found
        owner = torch.where(launched, links.launches.values[0][where], owner)
        category = torch.where(launched, links.launches.values[1][where], category)
    _per_op(out, owner, length, names.names)
    _flop_device_time(out, device.external, length, links, names.names)
    _matmuls(out, device, links, precision, length)
    out.kernel_us.extend(length.tolist())
    where, returned = links.launch_end.find(device.correlation)
    if bool(returned.any()):
        out.launch_delay_us.extend((device.start - links.launch_end.values[0][where])[returned].clamp(min=0).tolist())
    sums = torch.zeros(len(CATEGORIES), dtype=torch.float64).scatter_add_(0, category, length).tolist()
    for code, us in enumerate(sums):
        out.device_category_us[CATEGORIES[code]] += us
    out.device_kernels += len(device)
    pageable = names.pageable[device.name]
    out.pageable_h2d += int(pageable.sum())
    out.pageable_h2d_us += float(length[pageable].sum())
    _timeline(out, device, category, length, names.names)
    where, known = links.in_step.find(device.correlation)  # never for 0, no call's id
    in_step = known & links.in_step.values[0][where] if len(links.in_step.keys) else known
    intervals = torch.stack([device.start, device.end], dim=1)
    return _busy_time(out, links, windows, before, _Kernels(intervals, intervals[in_step], intervals[~known]))


def _per_op(out: TraceSummary, owner: torch.Tensor, length: torch.Tensor, names: list[str]) -> None:
    """Each op's (or user range's) device time, a new row made where there is none."""
    has = owner >= 0
    ids = owner[has]
    if not len(ids):
        return
    sums = torch.zeros(len(names), dtype=torch.float64).scatter_add_(0, ids, length[has]).tolist()
    for i in torch.unique(ids).tolist():
        stats = out.ops.get(names[i])
        if stats is None:
            stats = out.ops[names[i]] = OpStats(names[i])
        stats.self_device_us += sums[i]


def _flop_device_time(out: TraceSummary, external: torch.Tensor, length: torch.Tensor, links: ColumnLinks,
                     names: list[str]) -> None:
    """Add each device event's time (``length``, by its launching op's id ``external``) to the counted op above
    that op, where that op has a row."""
    if links.flop_owner is None or not len(links.flop_owner.keys):
        return
    at, found = links.flop_owner.find(external)
    owner = links.flop_owner.values[0][at][found]
    sums = torch.zeros(len(names), dtype=torch.float64).scatter_add_(0, owner, length[found]).tolist()
    for op in torch.unique(owner).tolist():
        stats = out.ops.get(names[op])
        if stats is not None:
            stats.flop_device_us += sums[op]


def _matmuls(out: TraceSummary, device: DeviceColumns, links: ColumnLinks, precision: torch.Tensor,
             length: torch.Tensor) -> None:
    """Matmul kernels' time by precision: 16-bit ones off the tensor cores' grain by shape (in the order the
    first of each comes), fp32 ones' calls and their time by call."""
    low, fp32 = precision == LOW, precision == FP32
    out.matmul_low_device_us += float(length[low].sum())
    out.matmul_fp32_device_us += float(length[fp32].sum())
    if links.misaligned and bool(low.any()):
        ids, us = device.external[low].tolist(), length[low].tolist()
        for corr, dur in zip(ids, us):
            shape = links.misaligned.get(corr)
            if shape is not None:
                out.misaligned_matmul_device_us += dur
                out.misaligned_shapes[shape] += dur
    if bool(fp32.any()):
        calls = torch.unique(device.external[fp32], return_inverse=True)
        out.matmul_fp32_device_calls += len(calls[0])
        sums = torch.zeros(len(calls[0]), dtype=torch.float64).scatter_add_(0, calls[1], length[fp32]).tolist()
        for corr, us in zip(calls[0].tolist(), sums):
            call = links.fp32_calls.get(corr)
            if call is not None:
                out.fp32_matmuls[call][2] += us


def _timeline(out: TraceSummary, device: DeviceColumns, category: torch.Tensor, length: torch.Tensor,
              names: list[str]) -> None:
    """A bar per device event on its stream's lane, added to the timeline and bounded (timeline.add_bounded)."""
    lanes = {stream: i for i, stream in enumerate(dict.fromkeys(device.stream))}
    lane = torch.tensor([lanes[stream] for stream in device.stream], dtype=torch.long)
    add_bounded(out, Bars([f"GPU stream {stream}" for stream in lanes], lane, device.start, length, CATEGORIES,
                          category.long(), names, device.name.long()))


@dataclass
class _Kernels:
    """A group's device intervals: all, those launched in the steps, those whose launch is not in the trace."""

    intervals: torch.Tensor
    launched_in_steps: torch.Tensor
    unlinked: torch.Tensor


def _busy_time(out: TraceSummary, links: ColumnLinks, windows: list, before: DeviceBusy,
               kernels: _Kernels) -> DeviceBusy:
    """The device time of the steps: the union of the kernels the steps launched, wherever they ran (a host ahead
    of its GPU leaves the last steps' kernels running after the profiled window), and where the launch is not in
    the trace, of the kernels run inside the steps (the group before's that ran past its steps included), less
    what the group before counted; and the data loading the device sat idle through."""
    busy, unlinked = union(kernels.intervals), union(kernels.unlinked, before.after)
    steps_busy = union(kernels.launched_in_steps, intersection(unlinked, union(as_set(windows))))
    out.device_busy_us += total(steps_busy) - overlap(steps_busy, before.steps)
    data = union(as_set(links.data))
    exposed = total(data) - overlap(data, union(busy, before.all))
    out.data_exposed_us = (out.data_exposed_us or 0.0) + exposed
    end = windows[-1][1] if windows else -float("inf")
    after = unlinked[unlinked[:, 1] > end]
    after[:, 0] = after[:, 0].clamp(min=end)
    return DeviceBusy(busy, steps_busy, after)


def count_lost(out: TraceSummary, device: DeviceColumns, links: ColumnLinks, first: int | None) -> int | None:
    """Kernels (and copies) whose runtime call is not in the trace, and kernel launches made in the steps whose
    kernel is not: CUPTI pairs them by correlation id, so either side missing is an event lost.  CUPTI numbers
    calls in order, so a kernel numbered below the trace's first runtime call was launched before the trace
    began (a queue the GPU was still running: 614 kernels in HTA's trace_diff trace), not lost.  A trace with
    no runtime call at all recorded only the device's side: nothing is counted there.  Group after group the
    counts add up, and ``first`` is the lowest runtime call's id of the groups so far (returned, with this
    group's)."""
    if len(links.in_step.keys):
        lowest = int(links.in_step.keys[0])
        first = lowest if first is None else min(first, lowest)
    if not len(device) or first is None:
        return first
    _, launched = links.in_step.find(device.correlation)
    out.kernels_without_launch += int(((device.correlation > first) & ~launched).sum())
    at, known = links.in_step.find(links.launch_end.keys)
    launches = links.launch_end.keys[known & links.in_step.values[0][at]] if len(links.in_step.keys) else _NONE
    out.kernel_launches += len(launches)
    out.launches_without_kernel += int((~torch.isin(launches, device.correlation)).sum())
    return first
