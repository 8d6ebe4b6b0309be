"""One rank's operator-level report from its trace file, as ``%%torchprofile`` gives it.

A trace is read into columns as the per-rank pass reads it (columns.py), in that one reading, and summarised
over them (columnar.py; a live profile is read into the same columns: live_columns.py), whatever its size:
host work, runtime calls and the device's kernels, copies and memsets.  A trace the columns do not cover (a
value the checked path refuses, cuts or replaces) is read a second time, its events handed, one adapter
object each, to the summary the events path makes (profile/trace.py): the same categories, operator table
and findings, over every step.  That path holds events (about 0.75 KB each): a trace of more than
``OPS_EVENT_LIMIT`` events is read into groups of consecutive steps of about that many events each, spilled
to a private temporary folder (groups.py), and summarised one group at a time into one summary
(summarizer.py).  The columnar summary is cut into the same groups of steps.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from torch._C._autograd import DeviceType

from ....core.devices import DeviceInfo
from ....core.gc_pause import gc_paused
from ....core.devices.cuda import tensor_core_precision

from ..result import ProfileResult
from ..rules import RuleContext
from ..summary_fields import summary_fields
from ..options import ProfileOptions
from ..kineto import (CPU_OP, DEVICE_ACTIVITIES, STEP_PREFIX, USER_ANNOTATION, activity, external_id, is_runtime,
                              unread_device)
from ..events import DEVICE, MEMORY, OP, RUNTIME, Ev, event_kind
from ..summarizer import TraceSummarizer
from ..summary import TraceSummary
from .columnar import columnar_summary
from .columns import BatchColumns, ColumnReading, TraceColumns
from .fields import DEVICE_TYPES, INT_LIMIT, MAX_INPUTS, EventFields, literal
from .groups import StepGroups, group_starts
from .rank import RankTrace
from .reader import shown_path
from .records import LISTS_KEPT, NO_ARGS, Args, PlainFields, Record
from .sliced import SlicedTraceReader

OPS_EVENT_LIMIT = 300_000  # events held at once (a group of steps): about 220 MB, 6 s on the 2-core CPU machine
HELD_EVENTS_CAP = 3        # times that: a group of steps heavier than the average holds more
_NO_DETAILS = (-1, (), (), (), 0, 0, (0, -1))
_MEMORY = "[memory]"
_NO_KIND = (None,) * 6


class TraceEvent:
    """A Chrome-trace event with the accessors of torch's ``_KinetoEvent`` that the summary reads.

    Kineto writes an op's own id as ``External id``; a runtime call and the kernels it launched carry
    that op's id as ``External id`` too (``external id`` before torch 1.10), and CUPTI's ``correlation``
    between themselves.  Categories are read as the current schema names them (kineto.py)."""

    __slots__ = ("_name", "_cat", "_linked", "_start", "_dur", "_tid", "_external", "_correlation", "_sequence",
                 "_shapes", "_dtypes", "_concrete", "_flops", "_bytes", "_device", "_kind")

    def __init__(self, event: dict, args: dict, check: EventFields | None = None, index: int = 0):
        """``event`` with its ``args``, each field checked as ``check`` checks it (fields.py)."""
        check = check if check is not None else EventFields("trace")
        self._name = check.name(event, index)
        self._cat = activity(check.text(event.get("cat"), event, index, "'cat'"), self._name)
        self._linked = self._cat in DEVICE_ACTIVITIES or is_runtime(self._cat)
        self._start = round(check.time(event, index, "ts") * 1000)
        self._dur = round(check.time(event, index, "dur", 0.0) * 1000)
        self._tid = check.hashable(event.get("tid", 0), event, index, "'tid'")
        self._external, self._correlation = external_id(args), check.integer(args, "correlation", 0, event, index)
        self._sequence, self._shapes, self._dtypes, self._concrete, self._flops, self._bytes, self._device = _NO_DETAILS
        if self._cat == CPU_OP:  # what the summary reads of an op; of a [memory] event, its size and device
            self._sequence = check.integer(args, "Sequence number", -1, event, index)
            self._shapes = check.shapes(args, event, index)
            self._dtypes = check.texts(args, "Input type", event, index)
            self._concrete = check.texts(args, "Concrete Inputs", event, index)
            self._flops = check.number(args, "flops", 0, event, index)
        elif self._name == "[memory]":
            self._bytes = check.integer(args, "Bytes", 0, event, index)
            self._device = (check.integer(args, "Device Type", 0, event, index, low=0),
                            check.integer(args, "Device Id", -1, event, index))
            if self._device[0] not in DEVICE_TYPES:
                raise check.refuse(event, index, 'args["Device Type"]', f"is {self._device[0]}, not a device type "
                                   f"torch knows ({min(DEVICE_TYPES)} to {max(DEVICE_TYPES)})")
        self._kind = event_kind(self._cat, self._name)  # the light record it makes (read_trace_events)

    def name(self):
        return self._name

    def activity_type(self):
        return self._cat

    def start_ns(self):
        return self._start

    def duration_ns(self):
        return self._dur

    def start_thread_id(self):
        return self._tid

    def device_resource_id(self):  # a kernel's stream: kineto writes it as the event's thread
        return self._tid

    def is_async(self):
        return False

    def correlation_id(self):
        return self._correlation if self._linked else self._external

    def linked_correlation_id(self):
        return self._external if self._linked else 0

    def sequence_nr(self):
        return self._sequence

    def shapes(self):
        return self._shapes

    def dtypes(self):
        return self._dtypes

    def concrete_inputs(self):
        """The non-tensor arguments, as the trace writes them ("[2, 2]", "False", "" for a tensor)."""
        return [literal(value) for value in self._concrete]

    def flops(self):
        return self._flops

    def nbytes(self):
        return self._bytes

    def device_type(self):
        return DeviceType(self._device[0])

    def device_index(self):
        return self._device[1]


event_fields = operator.attrgetter(*TraceEvent.__slots__)  # what a TraceEvent keeps, as plain values


def event_from_fields(values: tuple) -> TraceEvent:
    """The TraceEvent ``event_fields`` gave ``values`` of."""
    e = TraceEvent.__new__(TraceEvent)
    (e._name, e._cat, e._linked, e._start, e._dur, e._tid, e._external, e._correlation, e._sequence, e._shapes,
     e._dtypes, e._concrete, e._flops, e._bytes, e._device, e._kind) = values
    return e


def read_trace_events(events: list[TraceEvent], trace_start_ns: int, out) -> tuple[list[Ev], list[Ev]]:
    """events.read_events on TraceEvents, from the kind each was given as it was read: the same records,
    their accessors' values read without calling them (a trace's events are neither async nor hidden)."""
    cpu, device = [], []
    t0 = trace_start_ns
    out.event_count += len(events)
    for e in events:
        kind = e._kind
        if kind is None:
            continue
        start = (e._start - t0) / 1000.0
        if kind == MEMORY:
            cpu.append(Ev(e._name, start, start, e._tid, MEMORY, e))
            continue
        ev = Ev(e._name, start, start + e._dur / 1000.0, e._tid, OP if kind == DEVICE else kind, e)
        if kind == DEVICE:
            ev.corr = e._external  # linked_correlation_id(): device events and runtime calls are linked
            device.append(ev)
            continue
        if kind == RUNTIME:
            ev.corr = e._external
        cpu.append(ev)
    return cpu, device


def trace_profile(trace: RankTrace, alongside: AlongsideReading | None = None) -> ProfileResult | None:
    """The operator-level report of one rank's trace, over all its steps: from what ``alongside`` read with
    the per-rank pass where that holds the trace, else in one more reading pass (rank.py read it already: its
    event count and steps say how to group the steps, about ``OPS_EVENT_LIMIT`` events a group, summarised one
    group at a time); None if a group holds far more (steps of very uneven size)."""
    read = operator_summary(trace, OPS_EVENT_LIMIT, alongside)
    if read is None:
        return None
    summary, seen = read
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


def too_big_to_table(trace: RankTrace, alongside: AlongsideReading | None = None) -> str | None:
    """Why a trace gets no operator table: more events than are held at once, and no steps to group them
    by, or steps that each hold more (the columns ``alongside`` read, where it did, hold any number)."""
    if alongside is not None and alongside.columns.columns is not None:
        return None
    if trace.events > OPS_EVENT_LIMIT and not trace.steps:
        return (f"No operator table: the trace has {trace.events:,} events and no ProfilerStep markers to group "
                f"them by, {OPS_EVENT_LIMIT:,} or so at a time (call prof.step() once per iteration)")
    if trace.events > OPS_EVENT_LIMIT and trace.events / len(trace.steps) > OPS_EVENT_LIMIT:
        return (f"No operator table: the trace's {len(trace.steps)} step(s) hold {trace.events:,} events, more "
                f"than the {OPS_EVENT_LIMIT:,} or so held at once to table them")
    return None


def operator_summary(trace: RankTrace, limit: int,
                     alongside: AlongsideReading | None = None) -> tuple[TraceSummary, Seen] | None:
    """The trace's summary over all its steps, read in groups of about ``limit`` events, and what the reading
    saw; None if a group holds over ``HELD_EVENTS_CAP`` times that, or the trace no timed event.  What
    ``alongside`` read into columns with the per-rank pass is taken where it holds the whole trace."""
    columns = alongside.held_columns() if alongside is not None else None
    if columns is not None:
        flops = columns.flops or _profiled_with_flops(trace.meta)
        summary, first, shapes = columnar_summary(columns, trace, limit, flops)
        seen = Seen(start=first, shapes=shapes, flops=flops, kernels=columns.kernels, steps=columns.steps,
                    meta=trace.meta)
        alongside.release_columns()  # (190 MB at 1 GB, let go before the findings are made)
        return summary, seen
    with StepGroups(trace, group_starts(trace, limit), event_fields, event_from_fields) as groups:
        with gc_paused():  # the events held (a group's) are in no cycle: the GC's passes would only cost time
            seen = _read_groups(trace, groups)
        if max(groups.events) > HELD_EVENTS_CAP * limit or seen.start is None:
            return None
        return _summarize(groups, seen), seen


def _profiled_with_flops(meta: dict) -> bool:
    """Whether the file says it was profiled with FLOPs (torch 2.13 writes ``"with_flops": 1`` and no count)."""
    return meta.get("with_flops") in (1, True)


def too_uneven_to_table() -> str:
    """Why a trace that ``trace_profile`` refused gets no operator table."""
    return (f"No operator table: a group of its steps holds over {HELD_EVENTS_CAP * OPS_EVENT_LIMIT:,} events (steps "
            "of very uneven size), more than are held at once to table them")


@dataclass
class Seen:
    """What the reading pass saw of the whole trace, besides its events."""

    start: int | None = None  # the first event's start (ns)
    shapes: bool = False
    flops: bool = False
    kernels: bool = False
    steps: bool = False
    meta: dict = field(default_factory=dict)
    dropped: int = 0  # ops whose inputs were too many to keep

    def note(self, e: TraceEvent) -> None:
        start, category = e.start_ns(), e.activity_type()
        if self.start is None or start < self.start:
            self.start = start
        self.shapes = self.shapes or bool(e.shapes())
        self.flops = self.flops or bool(e.flops())
        self.kernels = self.kernels or category in DEVICE_ACTIVITIES
        self.steps = self.steps or (category == USER_ANNOTATION and e.name().startswith(STEP_PREFIX))


def _read_groups(trace: RankTrace, groups: StepGroups) -> Seen:
    """Read the trace's timed events and [memory] records into their groups."""
    reader = SlicedTraceReader(trace.path)
    reading = _OpsReading(trace.path, groups)
    for batch in reader:
        reading.batch(batch)
    return reading.finished(reader.meta)


class _OpsReading:
    """The operator pass's reading of a trace's batches into ``groups``: typed records where their values are
    plain, the checked dicts where not (in the file's order either way), and what it saw (``seen``)."""

    def __init__(self, path: str, groups: StepGroups):
        self.seen, self.groups, self.check = Seen(), groups, EventFields(path, share=True)
        self.typed = _TypedRecords(PlainFields(self.check), groups)

    def batch(self, batch) -> None:
        check, seen, groups = self.check, self.seen, self.groups
        if batch.records is None:
            _read_event(batch.events()[0], batch.first, check, seen, groups)
            return
        for position in self.typed.read(batch.records):
            _read_event(batch.events()[position], batch.first + position, check, seen, groups)

    def finished(self, meta: dict) -> Seen:
        self.groups.settle()
        self.typed.noted(self.seen)
        self.seen.meta, self.seen.dropped = meta, self.check.dropped
        return self.seen


def alongside_reading(path: str) -> AlongsideReading:
    """An AlongsideReading of the trace at ``path``."""
    return AlongsideReading(path)


class AlongsideReading:
    """The operator pass's reading done as the per-rank pass reads the file (rank.read_rank's ``also``): the
    trace into columns (columns.py) in that one reading, whatever its size.  Where the columns give up (a
    value they do not cover), the operator pass reads the file again, as events."""

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

    def held_columns(self) -> TraceColumns | None:
        """The trace's columns where they hold all of it (None where the reading gave them up)."""
        return self.columns.columns


def _read_event(event, index: int, check: EventFields, seen: Seen, groups: StepGroups) -> None:
    """One event from its dict, each field checked as it is read."""
    check.event(event, index)
    phase = event.get("ph")
    if phase == "X" or (phase == "i" and event.get("name") == "[memory]"):
        read = TraceEvent(event, check.args(event, index), check, index)
        seen.note(read)
        groups.add(read, read._start, read._start + read._dur, read._cat in DEVICE_ACTIVITIES, read._linked,
                   read._correlation)


class _TypedRecords:
    """Typed records made the TraceEvents that TraceEvent(their dict) makes, and put in their groups; what
    a record's name and category decide worked out once per distinct pair (``kinds``)."""

    def __init__(self, plain: PlainFields, groups: StepGroups):
        self.plain, self.groups = plain, groups
        self.kinds: dict[tuple, tuple] = {}  # (name, cat) as written -> (name, cat, linked, device, role, kind)
        self.start, self.shapes, self.flops, self.kernels, self.steps = math.inf, False, False, False, False

    def read(self, records: list[Record]) -> Iterator[int]:
        """Read a batch's records; yields, in order, the position of each whose values are not plain."""
        kinds, plain, single, first, inputs_kept = self.kinds, self.plain, self.groups.single(), self.start, \
            self.plain.inputs
        make, cls = TraceEvent.__new__, TraceEvent  # TraceEvent as this module names it when reading
        for position, record in enumerate(records):
            phase = record.ph
            if phase != "X" and (phase != "i" or record.name != "[memory]"):
                continue
            kind = kinds.get((record.name, record.cat)) or self._kind(record.name, record.cat)
            (ts, dur, tid), args = plain.when(record), record.args or NO_ARGS
            name, cat, linked, device, role, light = kind or _NO_KIND
            if role is CPU_OP:  # what TraceEvent keeps of an op's args, as its checks keep them; None where not plain
                inputs = inputs_kept.get((bytes(args.dims), bytes(args.dtypes), bytes(args.concrete))) \
                    or plain.op_inputs(args)
                sequence, flops = args.sequence, args.flops
                details = None if inputs is None or not -INT_LIMIT <= sequence < INT_LIMIT \
                    or not 0 <= flops < INT_LIMIT else (sequence, *inputs, flops, 0, (0, -1))
            else:
                details = _NO_DETAILS if role is None else _memory_details(args)
            correlation = args.correlation
            if kind is None or ts is None or tid is None or details is None \
                    or not -INT_LIMIT <= correlation < INT_LIMIT:
                yield position
                continue
            external = args.external  # kineto.external_id: ``External id``, else the name torch 1.8-1.9 wrote
            if external is None:
                external = args.external_before_1_10 if args.external_before_1_10 is not None else 0
            e = make(cls)
            start, e._dur = round(ts * 1000), round(dur * 1000)
            e._name, e._cat, e._linked, e._start, e._tid, e._external, e._correlation, e._kind = \
                name, cat, linked, start, tid, external, correlation, light
            (e._sequence, e._shapes, e._dtypes, e._concrete, e._flops, e._bytes, e._device) = details
            if start < first:
                first = self.start = start
            if role is CPU_OP:
                self.shapes = self.shapes or bool(e._shapes)
                self.flops = self.flops or bool(e._flops)
            if single is not None:
                single.append(e)
            else:
                self.groups.add(e, start, start + e._dur, device, linked, correlation)

    def _kind(self, raw_name: str | None, raw_cat: str | None) -> tuple | None:
        """What a record's name and category say (None where either is not plain), as TraceEvent reads them."""
        name, text = self.plain.text(raw_name), self.plain.text(raw_cat)
        if name is None or text is None:
            return None
        cat = activity(text, name)
        role = CPU_OP if cat == CPU_OP else _MEMORY if name == "[memory]" else None
        kind = (name, cat, cat in DEVICE_ACTIVITIES or is_runtime(cat), cat in DEVICE_ACTIVITIES, role,
                event_kind(cat, name))
        # every record of a pair is kept (here or by the checked path) or refused: what it tells holds
        self.kernels = self.kernels or cat in DEVICE_ACTIVITIES
        self.steps = self.steps or (cat == USER_ANNOTATION and name.startswith(STEP_PREFIX))
        if len(self.kinds) < LISTS_KEPT:
            self.kinds[raw_name, raw_cat] = kind
        return kind

    def noted(self, seen: Seen) -> None:
        """What the records told, added to what ``seen`` noted of the checked path's events."""
        if self.start < math.inf and (seen.start is None or self.start < seen.start):
            seen.start = self.start
        seen.shapes, seen.flops = seen.shapes or self.shapes, seen.flops or self.flops
        seen.kernels, seen.steps = seen.kernels or self.kernels, seen.steps or self.steps


def _memory_details(args: Args) -> tuple | None:
    """What TraceEvent keeps of a [memory] record's args, as its checks keep them; None where not plain."""
    nbytes, kind, index = args.nbytes, args.device_type, args.device_id
    if not (-INT_LIMIT <= nbytes < INT_LIMIT and kind in DEVICE_TYPES and -INT_LIMIT <= index < INT_LIMIT):
        return None
    return -1, (), (), (), 0, nbytes, (kind, index)


def _summarize(groups: StepGroups, seen: Seen) -> TraceSummary:
    """The groups summarised one after the other into one summary."""
    flops = seen.flops or _profiled_with_flops(seen.meta)
    summarizer = TraceSummarizer(seen.start, shapes=seen.shapes, flops=flops, compact=groups.count > 1,
                                 read=read_trace_events)
    for index in range(groups.count):
        events = groups.group(index)
        if not seen.steps:  # one group: one step, on the thread that ran most ops
            events.append(_whole_trace_marker(events, seen.start))
        summarizer.add(events, last=index == groups.count - 1)
        del events
    summary = summarizer.finish()
    summary.event_count -= groups.copies  # events open across a group's start were read into each group
    return summary


def _whole_trace_marker(events: list[TraceEvent], start: int) -> TraceEvent:
    busiest = Counter(e.start_thread_id() for e in events if e.activity_type() == CPU_OP).most_common(1)
    end = max(e.start_ns() + e.duration_ns() for e in events)
    return TraceEvent({"name": f"{STEP_PREFIX}0", "cat": USER_ANNOTATION, "ts": start / 1000,
                       "dur": (end - start) / 1000, "tid": busiest[0][0] if busiest else 0}, {})


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
