"""One rank's trace, reduced while it streams by: step windows, unions of busy, data-loading and
communication time, and each collective's execution (for matching across ranks).

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
from dataclasses import dataclass, field
from typing import Any

import torch
from msgspec import UNSET

from ....core.gc_pause import gc_paused
from ..array_views import tensor_view
from ..kineto import (CPU_OP, DATA_PREFIX, DEVICE_ACTIVITIES, HOST_BACKENDS, KERNEL, OPTIMIZER_PREFIXES,
                              PYTHON_FUNCTION, STEP_PREFIX, USER_ANNOTATION, activity, is_backward_node, is_runtime)
from ..column_intervals import grouped_totals
from ..intervals import IntervalSet
from .columns import BatchColumns
from .fields import INT_LIMIT, EventFields
from .rank_batch import (BACKWARD, COUNTED, DEVICE, HOST, LAUNCH, NOT_TIMED, TAKEN, UNREAD, BatchRoles, add_links,
                         category_counts)
from .records import LISTS_KEPT, NO_ARGS, Args, PlainFields
from .sliced import SlicedTraceReader

MAX_KINDS = 256  # categories, collectives' names: any beyond are counted together
# what _Reading.records does with a record (its kind's role): hand it to take(), or what take() would do inline
_TAKEN, _HOST, _BACKWARD, _COUNTED = "taken", "host op", "backward node", "counted"
_LAUNCH, _DEVICE = "runtime call", "device work"  # not a collective's
_NO_KIND = (None, None, False, _TAKEN)
_CHUNK = 1 << 18  # runtime calls matched to their steps at a time
_ROLE_CODES = {_HOST: HOST, _BACKWARD: BACKWARD, _DEVICE: DEVICE, _LAUNCH: LAUNCH, _COUNTED: COUNTED, _TAKEN: TAKEN}
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


def read_rank(events, path: str, also=None) -> RankTrace:
    """Reduce a stream of trace events (dicts, or a SlicedTraceReader's batches) to a RankTrace: each field
    checked as it is read (fields.py), and what repeats kept once (a collective, a launch or a kernel seen again).
    ``also``: called with each batch first (another reading done in the same pass); where it has ``batch_columns``,
    a batch it read into columns is taken from those."""
    reading = _Reading(path)
    with gc_paused():  # each slice makes thousands of objects, none in a cycle: the GC's passes would only cost time
        if isinstance(events, SlicedTraceReader):
            plain = PlainFields(reading.check)
            columns = getattr(also, "batch_columns", None)  # where ``also`` reads batches into columns
            for batch in events:
                if also is not None:
                    also(batch)
                if batch.records is None:
                    reading.event(batch.events()[0], batch.first)
                    continue
                read = columns() if columns is not None else None
                if read is None or not reading.columns(batch, read, plain):
                    reading.records(batch, plain)
        else:
            for position, ev in enumerate(events):
                reading.event(ev, getattr(events, "index", position))  # the reader's: oversized events not yielded
    return reading.finished()


class _DictDetails:
    """What an event says beyond its times, name and category, read from its dict (checked when read)."""

    __slots__ = ("check", "ev", "index", "args")

    def __init__(self, check: EventFields, ev: dict, index: int, args: dict):
        self.check, self.ev, self.index, self.args = check, ev, index, args

    def correlation(self) -> int | None:
        return _correlation(self.args)

    def finished(self) -> bool:
        return _finished(self.args)

    def thread(self) -> int | str:
        return self.check.hashable(self.ev.get("tid", 0), self.ev, self.index, "'tid'")

    def comm_sizes(self) -> tuple[str, int, str] | None:
        return _collective_sizes(self.args, self.check, self.ev, self.index)


class _RecordDetails:
    """The same from a typed record, its values already found plain (records.py)."""

    __slots__ = ("args", "tid", "sizes")

    def __init__(self, args: Args, tid: int | str, sizes: tuple[str, int, str] | None):
        self.args, self.tid, self.sizes = args, tid, sizes

    def correlation(self) -> int | None:
        return _plain_correlation(self.args.correlation)

    def finished(self) -> bool:
        return self.args.finished

    def thread(self) -> int | str:
        return self.tid

    def comm_sizes(self) -> tuple[str, int, str] | None:
        return self.sizes


def _plain_sizes(args: Args, plain: PlainFields):
    """record_param_comms' sizes from a record: None where there are none, False where not plain."""
    if args.collective is UNSET or args.elements is UNSET:
        return None
    name, dtype = plain.text(args.collective), plain.text(args.dtype)
    if name is None or dtype is None or not 0 <= args.elements < INT_LIMIT:
        return False
    return name, args.elements, dtype


class _Reading:
    """One rank's trace being read: the RankTrace so far, the checks of its fields, and its collectives
    (each kept once: the same one written again, same thread and times, is not)."""

    def __init__(self, path: str):
        self.out = RankTrace(path)
        self.check = EventFields(path)
        self.collectives: dict[tuple, Collective] = {}  # (host?, op, start, end, thread, finished) -> it
        self.first, self.last = float("inf"), float("-inf")  # the first start and last end of timed events
        self.kinds: dict[tuple, tuple] = {}  # a record's (name, cat) as written -> what _kind makes of them
        self.roles = BatchRoles(_ROLE_CODES)  # what _kind makes of the columns' kind codes (``columns``)

    def event(self, ev, index: int) -> None:
        """One event from its dict, each field checked as it is read."""
        check = self.check
        self.out.events += 1
        check.event(ev, index)
        if ev.get("ph") != "X":
            return
        start = check.time(ev, index, "ts")
        end = start + check.time(ev, index, "dur", 0.0)
        name = check.name(ev, index)
        cat = activity(check.text(ev.get("cat"), ev, index, "'cat'"), name)
        args = check.args(ev, index)
        self.take(start, end, name, cat, _DictDetails(check, ev, index, args))

    def records(self, batch, plain: PlainFields, chosen: list | None = None) -> None:
        """A batch of typed records (``chosen``: only these of them, as (None, record) pairs, counted already);
        one whose values are not plain is read from its dict instead.  What ``take`` does with a host op (most
        events) is done here, without the call."""
        out = self.out
        if chosen is None:
            out.events += len(batch.records)
        kinds, take, when, categories = self.kinds, self.take, plain.when, out.categories
        host_busy, backward, device_busy = out.host_busy, out.backward, out.device_busy
        for position, record in enumerate(batch.records) if chosen is None else chosen:
            if record.ph != "X":
                continue
            kind = kinds.get((record.name, record.cat)) or self._kind(record.name, record.cat, plain)
            ts, dur, tid = record.ts, record.dur, record.tid
            if type(ts) is not float or not -math.inf < ts < math.inf or type(dur) is not float \
                    or not 0 <= dur < math.inf or type(tid) is not int or not -INT_LIMIT < tid < INT_LIMIT:
                ts, dur, tid = when(record)
            name, cat, detailed, role = kind or _NO_KIND
            args = record.args or NO_ARGS
            sizes = _plain_sizes(args, plain) if name == "record_param_comms" else None
            if kind is None or ts is None or tid is None or sizes is False:
                out.events -= 1  # counted again there
                if position is None:
                    position = next(i for i, held in enumerate(batch.records) if held is record)
                self.event(batch.events()[position], batch.first + position)
                continue
            if role is _TAKEN:
                take(ts, ts + dur, name, cat, _RecordDetails(args, tid, sizes) if detailed else None)
                continue
            counted = cat if cat in categories or len(categories) < MAX_KINDS else "(other)"
            categories[counted] = categories.get(counted, 0) + 1
            end = ts + dur
            if ts < self.first:
                self.first = ts
            if end > self.last:
                self.last = end
            if role is _HOST or role is _BACKWARD:
                host_busy.add(ts, end)
                if role is _BACKWARD:
                    backward.add(ts, end)
            elif role is _DEVICE:
                device_busy.add(ts, end)
                _correlated(out, _plain_correlation(args.correlation), ts, end)
            elif role is _LAUNCH:
                _launched(out, _plain_correlation(args.correlation), ts)

    def columns(self, batch, read: BatchColumns, plain: PlainFields) -> bool:
        """A batch the columns read, its records' part done over tensors as ``records`` would do it, but for the
        steps, ranges and collectives ``take`` reads one by one; False (nothing done) where a record's name or
        category is not plain, or the categories would pass MAX_KINDS: ``records`` reads it then."""
        table = self.roles.tensors(read.raw_kinds, lambda name, cat: self.kinds.get((name, cat))
                                   or self._kind(name, cat, plain))
        out = self.out
        kind = tensor_view(read.kinds, torch.int32).long()
        role = table[0][kind]
        if bool((role == UNREAD).any()):
            return False
        if read.memory:  # a memory record ('i') is no timed event here (an 'X' of its name and category is)
            role[[i for i in read.memory if read.timed[i].ph != "X"]] = NOT_TIMED
        timed = role != NOT_TIMED
        taken = role == TAKEN
        counts = category_counts(table[1][kind[timed]], ~taken[timed], self.roles.categories, out.categories)
        if len(set(out.categories) | {name for name, _ in counts}) > MAX_KINDS:
            return False
        out.events += len(batch.records)
        for name, count in counts:
            out.categories[name] = out.categories.get(name, 0) + count
        ts = tensor_view(read.ts, torch.float64)
        end = ts + tensor_view(read.dur, torch.float64)
        bulk = timed & ~taken
        if bool(bulk.any()):
            self.first, self.last = min(self.first, float(ts[bulk].min())), max(self.last, float(end[bulk].max()))
        host, backward, device = (role == HOST) | (role == BACKWARD), role == BACKWARD, role == DEVICE
        out.host_busy.add_all(ts[host], end[host])
        out.backward.add_all(ts[backward], end[backward])
        out.device_busy.add_all(ts[device], end[device])
        corr = tensor_view(read.correlation, torch.long)
        linked = device & (corr > 0)
        add_links(out.kernel_start, out.kernel_end, out.kernel_corr, (ts[linked], end[linked], corr[linked]))
        linked = (role == LAUNCH) & (corr > 0)
        add_links(out.launch_ts, None, out.launch_corr, (ts[linked], None, corr[linked]))
        if bool(taken.any()):
            self.records(batch, plain, [(None, read.timed[i]) for i in taken.nonzero().flatten().tolist()])
        return True

    def _kind(self, raw_name: str | None, raw_cat: str | None, plain: PlainFields) -> tuple | None:
        """A record's name and category as kept, its current-schema category, whether ``take`` reads its
        details (not an op's, but record_param_comms's), and what ``records`` does with it (its role: a host op
        or a backward node's, a runtime call's, device work but a collective's, counted only, or handed to
        ``take``); None where the name or category is not plain."""
        name, cat = plain.text(raw_name), plain.text(raw_cat)
        if name is None or cat is None:
            return None
        cat = activity(cat, name)
        detailed = cat not in (CPU_OP, PYTHON_FUNCTION) or name == "record_param_comms"
        if cat == CPU_OP and not name.startswith("c10d::") and name != "record_param_comms":
            role = _BACKWARD if is_backward_node(name) else _HOST
        elif cat in DEVICE_ACTIVITIES and (cat != KERNEL or collective_op(cat, name) is None):
            role = _DEVICE
        elif is_runtime(cat):
            role = _LAUNCH
        elif cat in (CPU_OP, USER_ANNOTATION, KERNEL):
            role = _TAKEN
        else:
            role = _COUNTED  # take() would only count it
        kind = name, cat, detailed, role
        if len(self.kinds) < LISTS_KEPT:
            self.kinds[raw_name, raw_cat] = kind
        return kind

    def take(self, start: float, end: float, name: str, cat: str, details) -> None:
        """A timed event's part in the reduction."""
        out = self.out
        counted = cat if cat in out.categories or len(out.categories) < MAX_KINDS else "(other)"
        out.categories[counted] = out.categories.get(counted, 0) + 1
        if start < self.first:
            self.first = start
        if end > self.last:
            self.last = end
        if cat == CPU_OP:
            if name.startswith("c10d::"):  # c10d ops enqueue work, and may block on it
                return
            if name == "record_param_comms":
                _add_collective_sizes(out, details.comm_sizes())
                return
            out.host_busy.add(start, end)
            if is_backward_node(name):
                out.backward.add(start, end)
        elif cat == USER_ANNOTATION:
            self.annotation(name, start, end, details)
        elif cat == KERNEL:
            op = collective_op(cat, name)
            if op is None:
                out.device_busy.add(start, end)
                _correlated(out, details.correlation(), start, end)
            else:
                out.device_comm.add(start, end)
                self.collective(False, op, start, end, details)
        elif cat in DEVICE_ACTIVITIES:
            out.device_busy.add(start, end)
            _correlated(out, details.correlation(), start, end)
        elif is_runtime(cat):
            _launched(out, details.correlation(), start)

    def annotation(self, name: str, start: float, end: float, details) -> None:
        """A user annotation: a step, data loading, an optimizer's step, or a host backend's collective."""
        out = self.out
        if name.startswith(STEP_PREFIX):
            number = step_number(name)
            if number is not None:
                out.steps[number] = (start, end)
        elif name.startswith(DATA_PREFIX):
            out.data.add(start, end)
            out.host_busy.add(start, end)
        elif name.startswith(OPTIMIZER_PREFIXES):
            out.optimizer.add(start, end)
        elif name.startswith(HOST_BACKENDS):
            out.host_comm.add(start, end)
            self.collective(True, collective_op(USER_ANNOTATION, name), start, end, details)

    def collective(self, host: bool, op: str, start: float, end: float, details) -> None:
        """Keep a collective's execution, once."""
        key = (host, op, start, end, details.thread(), details.finished())
        if key not in self.collectives:
            self.collectives[key] = Collective(op, start, end - start, key[-1])

    def finished(self) -> RankTrace:
        """The RankTrace, once every event is read."""
        out = self.out
        out.host_collectives = [c for key, c in self.collectives.items() if key[0]]
        out.device_collectives = [c for key, c in self.collectives.items() if not key[0]]
        out.cut_strings = self.check.cut
        if self.first <= self.last:
            out.span = (self.first, self.last)
        return out


def step_number(name: str) -> int | None:
    """N of ``ProfilerStep#N`` (ASCII digits, at most 18: any other tail is not a step)."""
    tail = name[len(STEP_PREFIX):]
    return int(tail) if tail.isascii() and tail.isdigit() and len(tail) <= 18 else None


def _correlated(out: RankTrace, corr: int | None, start: float, end: float) -> None:
    """Keep a compute kernel's run with the correlation id of the runtime call that launched it
    (once: the same kernel written again in a row is not kept again)."""
    if corr is not None and not (out.kernel_corr and out.kernel_corr[-1] == corr and out.kernel_start[-1] == start):
        out.kernel_start.append(start)
        out.kernel_end.append(end)
        out.kernel_corr.append(corr)


def _launched(out: RankTrace, corr: int | None, start: float) -> None:
    """Keep a runtime call's start with its correlation id (once: the same call written again in a row is not
    kept again)."""
    if corr is not None and not (out.launch_corr and out.launch_corr[-1] == corr and out.launch_ts[-1] == start):
        out.launch_ts.append(start)
        out.launch_corr.append(corr)


def _plain_correlation(corr: int) -> int | None:
    """A typed record's correlation id, None for none (0, or past 64 bits)."""
    return corr if 0 < corr < 1 << 63 else None


def _correlation(args: dict) -> int | None:
    corr = args.get("correlation")
    return corr if type(corr) is int and 0 < corr < 1 << 63 else None


def _finished(args: dict) -> bool:
    """False for a range still open when the profiler stopped (kineto ends it there)."""
    return args.get("finished", True) is not False


def _collective_sizes(args: dict, check: EventFields, ev: dict, index: int) -> tuple[str, int, str] | None:
    """The collective's name, elements and dtype of a ``record_param_comms`` event (what NCCL and newer
    gloo traces carry), or None."""
    if "Collective name" not in args or "In msg nelems" not in args:
        return None
    name = check.text(args["Collective name"], ev, index, 'args["Collective name"]')
    elements = check.integer(args, "In msg nelems", 0, ev, index, low=0)
    dtype = check.text(args.get("dtype"), ev, index, 'args["dtype"]')
    return name, elements, dtype


def _add_collective_sizes(out: RankTrace, sizes: tuple[str, int, str] | None) -> None:
    if sizes is None:
        return
    name, elements, dtype = sizes
    key = name.replace("_", "").lower()
    if key in out.comm_bytes or len(out.comm_bytes) < MAX_KINDS:
        out.comm_bytes[key] += elements * _DTYPE_BYTES.get(dtype, 0)
