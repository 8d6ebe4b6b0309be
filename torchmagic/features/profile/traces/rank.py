"""One rank's trace reduced from its columns (event_table.py) by queries over them: step windows, unions of busy,
data-loading and communication time, each collective's execution (for matching across ranks), and the launch ids
that tie kernels to the steps that launched them.

What counts as what (kineto's Chrome trace, torch 2.x):

* a **step** is a ``ProfilerStep#N`` annotation (``profiler.step()``);
* **communication** is where a collective executes: NCCL kernels on a GPU (``ncclDevKernel_*``,
  ``ncclKernel_*``), the backend's own range on CPU (gloo's ``gloo:all_reduce`` on its
  ``pt_gloo_runloop`` thread; ``mpi:``, ``ucc:`` alike).  ``c10d::allreduce_`` on the calling
  thread only enqueues the work, and ``record_param_comms`` only describes it (its sizes are
  read);
* **busy** is compute: kernels, copies and memsets on a GPU trace, else CPU ops on threads other
  than the backend's (and data loading);
* **data loading** is ``enumerate(DataLoader)#...__next__``.
"""

from __future__ import annotations

import bisect
import math
import re
from array import array
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..array_views import doubles, tensor_view
from ..event_kinds import MEMORY
from ..intervals import IntervalSet, grouped_totals
from ..kineto import (CPU_OP, DATA_PREFIX, DEVICE_ACTIVITIES, HOST_BACKENDS, KERNEL, OPTIMIZER_PREFIXES, STEP_PREFIX,
                      USER_ANNOTATION, is_backward_node, is_runtime)
from .table_codes import EventKind
from .event_table import EventTable

MAX_KINDS = 256  # categories, collectives' names: any beyond are counted together
_CHUNK = 1 << 18  # runtime calls matched to their steps at a time
_ROWS = 1 << 20  # rows of the columns reduced at a time (their temporaries about 40 MB)
# what an event's kind is to the pass (NOT_TIMED: a memory record; COUNTED: a timed event only counted, as c10d's
# calls, which enqueue work and may block on it, and record_param_comms, which describes it)
(NOT_TIMED, COUNTED, HOST, BACKWARD, DATA, OPTIMIZER, STEP, HOST_COMM, DEVICE, DEVICE_COMM, LAUNCH) = range(11)
_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
# bytes per element of record_param_comms' dtype names
_DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4, "Char": 1, "Byte": 1,
                "Bool": 1, "Short": 2, "Float8_e4m3fn": 1, "Float8_e5m2": 1}


def collective_op(cat: str, name: str) -> str | None:
    """The collective an event executes ('all_reduce' ...), or None if it is not one."""
    if cat == KERNEL:
        match = _NCCL_KERNEL.match(name)
        return _CAMEL.sub("_", match.group(1)).lower() if match else None
    if name.startswith(HOST_BACKENDS):
        return name.split(":", 1)[1]
    return None


@dataclass
class Collective:
    op: str
    start: float      # µs, on this rank's clock
    dur: float
    finished: bool    # False: still running when the profiler stopped (its duration is cut short)


@dataclass
class RankTrace:
    """What one trace file holds, reduced.  Times in µs on the file's own clock."""

    path: str
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    events: int = 0
    bytes_read: int = 0
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    span: tuple[float, float] | None = None      # first start, last end: the window without steps
    host_busy: IntervalSet = field(default_factory=IntervalSet)
    device_busy: IntervalSet = field(default_factory=IntervalSet)
    host_comm: IntervalSet = field(default_factory=IntervalSet)
    device_comm: IntervalSet = field(default_factory=IntervalSet)
    data: IntervalSet = field(default_factory=IntervalSet)
    backward: IntervalSet = field(default_factory=IntervalSet)
    optimizer: IntervalSet = field(default_factory=IntervalSet)
    host_collectives: list[Collective] = field(default_factory=list)
    device_collectives: list[Collective] = field(default_factory=list)
    comm_bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # 'allreduce' -> bytes
    meta: dict[str, Any] = field(default_factory=dict)
    categories: dict[str, int] = field(default_factory=dict)  # timed events by (current-schema) category
    cut_strings: int = 0  # strings longer than fields.TEXT_CHARS, kept cut
    read_notes: list[str] = field(default_factory=list)  # what was cut or left out while reading
    # CUPTI's correlation ids, which number runtime calls in the order they were made, process-wide:
    # each runtime call's (start, id), and each compute kernel's (start, end, id) (16 and 24 bytes each)
    launch_ts: array = field(default_factory=lambda: array("d"))
    launch_corr: array = field(default_factory=lambda: array("q"))
    kernel_start: array = field(default_factory=lambda: array("d"))
    kernel_end: array = field(default_factory=lambda: array("d"))
    kernel_corr: array = field(default_factory=lambda: array("q"))

    @property
    def on_device(self) -> bool:
        """A GPU trace: kernels ran (compute and communication are read from them)."""
        return bool(self.device_busy.merged()[0] or self.device_collectives)

    @property
    def compute(self) -> IntervalSet:
        """Compute: kernels on a GPU trace; CPU ops less data loading on a CPU one."""
        return self.device_busy if self.on_device else self.host_busy.minus(self.data)

    @property
    def hiding(self) -> IntervalSet:
        """What hides communication: kernels on a GPU (the host loading data leaves the device
        idle); on CPU, any work of the process, data loading included."""
        return self.device_busy if self.on_device else self.host_busy

    @property
    def comm(self) -> IntervalSet:
        return self.device_comm if self.on_device else self.host_comm

    @property
    def collectives(self) -> list[Collective]:
        return self.device_collectives if self.on_device else self.host_collectives

    def launched_compute(self) -> list[float] | None:
        """µs of compute kernels each step launched (the union of their runs, wherever they ran), in
        window order; None without steps, or without the correlation ids to tell by.

        A host ahead of its GPU leaves kernels running after the step that launched them, the last
        steps' after the profiled window: clipping kernels to the steps' windows loses them.  A step's ids
        are those of the runtime calls inside its window, lowest to highest; a kernel belongs to the step
        whose lowest id is the highest at or below its own, where its id is not past that step's highest."""
        windows = self.windows()
        if not self.steps or not self.kernel_corr or not self.launch_corr:
            return None
        opened = torch.tensor([start for _, start, _ in windows], dtype=torch.float64)
        closed = torch.tensor([end for _, _, end in windows], dtype=torch.float64)
        lowest = torch.full((len(windows),), torch.iinfo(torch.long).max)
        highest = torch.full((len(windows),), torch.iinfo(torch.long).min)
        calls, ids = tensor_view(self.launch_ts, torch.float64), tensor_view(self.launch_corr, torch.long)
        for at in range(0, len(calls), _CHUNK):  # (a GPU job's 1 GB rank holds 1.4M calls: their temporaries bounded)
            ts, corr = calls[at:at + _CHUNK], ids[at:at + _CHUNK]
            step = torch.searchsorted(opened, ts, right=True) - 1
            inside = (step >= 0) & (ts < closed[step.clamp(min=0)])
            lowest.scatter_reduce_(0, step[inside], corr[inside], "amin")
            highest.scatter_reduce_(0, step[inside], corr[inside], "amax")
        ranges = (lowest <= highest).nonzero().flatten()
        if not len(ranges):
            return None
        ranges = ranges[torch.argsort(highest[ranges], stable=True)]  # by (lowest, highest, step), as tuples sort
        ranges = ranges[torch.argsort(lowest[ranges], stable=True)]
        kernel = tensor_view(self.kernel_corr, torch.long)
        at = torch.searchsorted(lowest[ranges], kernel, right=True) - 1
        owned = (at >= 0) & (kernel <= highest[ranges][at.clamp(min=0)])
        return grouped_totals(ranges[at[owned]], tensor_view(self.kernel_start, torch.float64)[owned],
                              tensor_view(self.kernel_end, torch.float64)[owned], len(windows)).tolist()

    def windows(self) -> list[tuple[int | None, float, float]]:
        """(step number, start, end) of each profiled step, in time order; the whole trace as one
        window without."""
        if self.steps:
            return sorted(((n, *self.steps[n]) for n in self.steps), key=lambda w: w[1])
        return [(None, *self.span)] if self.span else []


def window_of(windows: list[tuple[int | None, float, float]], starts: list[float], t: float):
    """The window (from ``windows``, whose starts are ``starts``) that holds time ``t``, or None."""
    i = bisect.bisect_right(starts, t) - 1
    return windows[i] if i >= 0 and t < windows[i][2] else None


def rank_trace(columns: EventTable, path: str) -> RankTrace:
    """The RankTrace of a trace's columns (its times µs again: the ns kept over 1000), read ``_ROWS`` rows at a
    time."""
    out = RankTrace(path, events=columns.events, cut_strings=columns.cut_strings)
    roles = torch.tensor([_role(kind) for kind in columns.kinds], dtype=torch.int8)
    categories = _Categories(columns)
    collectives = _Collectives(columns)
    kernels, calls = _Linked(ends=True), _Linked(ends=False)
    first, last = math.inf, -math.inf
    for chunk in _chunks(columns, roles):
        timed = chunk.role != NOT_TIMED
        if not bool(timed.any()):
            continue
        first, last = min(first, float(chunk.start[timed].min())), max(last, float(chunk.end[timed].max()))
        categories.add(chunk.codes[timed])
        _add_unions(out, chunk)
        collectives.add(chunk)
    steps = step_windows(columns)
    times = (torch.tensor(list(steps.values()), dtype=torch.int64).double() / 1000).tolist()  # as the rows' µs
    out.steps = {number: tuple(window) for number, window in zip(steps, times)}
    for chunk in _chunks(columns, roles, tensor_view(columns.linked_rows, torch.int64)):
        ids = tensor_view(columns.correlation, torch.int64)[chunk.at:chunk.at + len(chunk.role)]
        kernels.add(chunk, ids, (chunk.role == DEVICE) & (ids > 0))
        calls.add(chunk, ids, (chunk.role == LAUNCH) & (ids > 0))
    if first <= last:
        out.span = (first, last)
    out.categories = categories.counted()
    out.host_collectives, out.device_collectives = collectives.host(), collectives.device()
    out.kernel_start, out.kernel_end, out.kernel_corr = kernels.starts, kernels.ends, kernels.ids
    out.launch_ts, out.launch_corr = calls.starts, calls.ids
    _comm_bytes(out, columns)
    return out


@dataclass
class _Chunk:
    """Some rows of the columns (``rows``; None: rows ``at`` on, in order), each one's kind code, role, and start and
    end in µs."""

    at: int
    rows: torch.Tensor | None
    codes: torch.Tensor
    role: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor

    def row(self, index: int) -> int:
        return self.at + index if self.rows is None else int(self.rows[index])


def _chunks(columns: EventTable, roles: torch.Tensor, rows: torch.Tensor | None = None) -> Iterator[_Chunk]:
    """The columns' rows (or only ``rows``), ``_ROWS`` at a time."""
    kinds = tensor_view(columns.kind, torch.int32)
    starts, ends = tensor_view(columns.start, torch.int64), tensor_view(columns.end, torch.int64)
    for at in range(0, len(kinds) if rows is None else len(rows), _ROWS):
        chosen = slice(at, at + _ROWS) if rows is None else rows[at:at + _ROWS]
        codes = kinds[chosen].long()
        yield _Chunk(at, None if rows is None else chosen, codes, roles[codes], starts[chosen].double() / 1000,
                     ends[chosen].double() / 1000)


def _add_unions(out: RankTrace, chunk: _Chunk) -> None:
    for unions, roles in ((out.host_busy, (HOST, BACKWARD, DATA)), (out.backward, (BACKWARD,)), (out.data, (DATA,)),
                          (out.optimizer, (OPTIMIZER,)), (out.host_comm, (HOST_COMM,)), (out.device_busy, (DEVICE,)),
                          (out.device_comm, (DEVICE_COMM,))):
        rows = torch.isin(chunk.role, torch.tensor(roles, dtype=torch.int8))
        unions.add_all(chunk.start[rows], chunk.end[rows])


def step_windows(columns: EventTable) -> dict[int, tuple[int, int]]:
    """Each ``ProfilerStep#N`` marker's start and end (ns) by N, in file order (a step written again: the last)."""
    codes = [code for code, kind in enumerate(columns.kinds) if _role(kind) == STEP]
    if not codes:
        return {}
    kinds = tensor_view(columns.kind, torch.int32)
    rows = torch.isin(kinds, torch.tensor(codes, dtype=torch.int32)).nonzero().flatten()
    steps = {}
    for code, opened, closed in zip(kinds[rows].tolist(), tensor_view(columns.start, torch.int64)[rows].tolist(),
                                    tensor_view(columns.end, torch.int64)[rows].tolist()):
        steps[step_number(columns.kinds[code].name)] = (opened, closed)
    return steps


def _role(kind: EventKind) -> int:
    """What the pass does with events of a kind (their name and category as kept)."""
    name, cat = kind.name, kind.cat
    if kind.kind == MEMORY:
        return NOT_TIMED
    if cat == CPU_OP:
        if name.startswith("c10d::") or name == "record_param_comms":
            return COUNTED
        return BACKWARD if is_backward_node(name) else HOST
    if cat == USER_ANNOTATION:
        if name.startswith(STEP_PREFIX):
            return STEP if step_number(name) is not None else COUNTED
        for prefixes, role in ((DATA_PREFIX, DATA), (OPTIMIZER_PREFIXES, OPTIMIZER), (HOST_BACKENDS, HOST_COMM)):
            if name.startswith(prefixes):
                return role
        return COUNTED
    if cat in DEVICE_ACTIVITIES:
        return DEVICE_COMM if collective_op(cat, name) is not None else DEVICE
    return LAUNCH if is_runtime(cat) else COUNTED


class _Categories:
    """Timed events counted by category, in the order each first appears; past MAX_KINDS, the rest as "(other)"."""

    def __init__(self, columns: EventTable):
        self.names = sorted({kind.cat for kind in columns.kinds})
        number = {name: i for i, name in enumerate(self.names)}
        self.of_kind = torch.tensor([number[kind.cat] for kind in columns.kinds], dtype=torch.long)
        self.counts = torch.zeros(len(self.names), dtype=torch.long)
        self.order: list[int] = []  # category numbers, as they first appear

    def add(self, codes: torch.Tensor) -> None:
        category = self.of_kind[codes]
        self.counts += torch.bincount(category, minlength=len(self.names))
        unique, inverse = torch.unique(category, return_inverse=True)
        first = torch.full((len(unique),), len(category)).scatter_reduce_(0, inverse, torch.arange(len(category)),
                                                                          "amin")
        seen = set(self.order)
        self.order += [code for code in unique[torch.argsort(first)].tolist() if code not in seen]

    def counted(self) -> dict[str, int]:
        found = {self.names[code]: int(self.counts[code]) for code in self.order[:MAX_KINDS]}
        if len(self.order) > MAX_KINDS:
            found["(other)"] = int(self.counts[self.order[MAX_KINDS:]].sum())
        return found


class _Collectives:
    """Each collective's execution, kept once (the same one written again, same thread and times, is not), in
    file order: a host backend's range, or a device's collective kernel."""

    def __init__(self, columns: EventTable):
        self.columns = columns
        self.unfinished = set(columns.unfinished_rows)
        self.kept: dict[tuple, Collective] = {}  # (host?, op, start, end, thread, finished) -> it

    def add(self, chunk: _Chunk) -> None:
        columns = self.columns
        rows = ((chunk.role == HOST_COMM) | (chunk.role == DEVICE_COMM)).nonzero().flatten()
        for index, code, opened, closed in zip(rows.tolist(), chunk.codes[rows].tolist(), chunk.start[rows].tolist(),
                                               chunk.end[rows].tolist()):
            row = chunk.row(index)
            kind = columns.kinds[code]
            key = (kind.cat == USER_ANNOTATION, collective_op(kind.cat, kind.name), opened, closed,
                   columns.threads[columns.thread[row]], row not in self.unfinished)
            if key not in self.kept:
                self.kept[key] = Collective(key[1], opened, closed - opened, key[5])

    def host(self) -> list[Collective]:
        return [c for key, c in self.kept.items() if key[0]]

    def device(self) -> list[Collective]:
        return [c for key, c in self.kept.items() if not key[0]]


def _comm_bytes(out: RankTrace, columns: EventTable) -> None:
    """The bytes record_param_comms says each collective moves ('allreduce' -> bytes; past MAX_KINDS names, none)."""
    for elements, code in zip(columns.comm_elements, columns.comm_kind):
        name, dtype = columns.comm_kinds[code]
        key = name.replace("_", "").lower()
        if key in out.comm_bytes or len(out.comm_bytes) < MAX_KINDS:
            out.comm_bytes[key] += elements * _DTYPE_BYTES.get(dtype, 0)


class _Linked:
    """Runs linked by CUPTI's correlation id (a compute kernel's, a runtime call's), in order, each kept once:
    kineto writes some device events twice, and one written again right after (the same id and start) is not
    kept again."""

    def __init__(self, ends: bool):
        self.starts, self.ends, self.ids = array("d"), array("d") if ends else None, array("q")
        self._last: tuple[int, float] | None = None  # the last kept's id and start

    def add(self, chunk: _Chunk, ids: torch.Tensor, chosen: torch.Tensor) -> None:
        ids, start, end = ids[chosen], chunk.start[chosen], chunk.end[chosen]
        if not len(ids):
            return
        once = torch.ones(len(ids), dtype=torch.bool)
        once[1:] = (ids[1:] != ids[:-1]) | (start[1:] != start[:-1])
        once[0] = self._last != (int(ids[0]), float(start[0]))
        self.starts.extend(doubles(start[once]))
        if self.ends is not None:
            self.ends.extend(doubles(end[once]))
        self.ids.extend(array("q", ids[once].tolist()))
        self._last = (int(ids[-1]), float(start[-1]))


def step_number(name: str) -> int | None:
    """N of ``ProfilerStep#N`` (ASCII digits, at most 18: any other tail is not a step)."""
    tail = name[len(STEP_PREFIX):]
    return int(tail) if tail.isascii() and tail.isdigit() and len(tail) <= 18 else None
