"""The event table (EventTable: a trace's events as columns), and a trace file read into it: the file's one
reading, from which the per-rank pass (rank.py) and the operator report (table_summary.py) are both made.

The reader's batches are read into columns a slice of typed records at once, and where a slice holds a value the
columns do not take as written (one the typed decoder refused, or one the checked path would refuse, cut or
replace; a name or category is cut or made printable within the slice, as that path keeps it), its events one by
one as the checked path (fields.py) reads them, whose one-line error refuses the file.  Every event is kept as a
plain op, user range, Python frame, runtime call, kernel (or copy, or memset) or memory record (or one the summary
sets aside), each value as the checked path keeps it; an op's inputs (shapes, types, non-tensor values) are kept
once per distinct value, however written.  A live profile fills the same columns from kineto's events
(profile/live_table.py).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

import torch
from msgspec import UNSET

from ....core.gc_pause import gc_paused
from ..array_views import append_values, tensor_view
from ..kineto import CPU_OP, external_id
from .table_codes import TableCodes, EventKind
from .fields import DEVICE_TYPES, INT_LIMIT, EventFields
from .fields import kind as kind_of
from .records import EMPTY_LIST, NO_ARGS, PlainFields
from .sliced import SlicedTraceReader

# times whose ns, ends and differences all fit in int64 (the columns' type): ±2**61 ns, 73 years either side of
# the clock's zero (kineto writes µs since the epoch, 1.7e12 today); a time beyond is refused (_read_checked)
TIME_LIMIT_US = 2**61 / 1000


@dataclass
class EventTable:
    """A trace's timed events in file order: start and end in ns (the file's µs as ns, ``ns_of``; an end, the
    start plus the duration times 1000, rounded half to even), thread (a device event's stream) and kind codes
    (``threads``, ``kinds`` give what they stand for), autograd sequence numbers, and the op each belongs to
    (``External id``: an op's own, a runtime call's or a kernel's launching op's)."""

    start: array = field(default_factory=lambda: array("q"))
    end: array = field(default_factory=lambda: array("q"))
    thread: array = field(default_factory=lambda: array("i"))
    kind: array = field(default_factory=lambda: array("i"))
    sequence: array = field(default_factory=lambda: array("q"))
    inputs: array = field(default_factory=lambda: array("i"))  # code into ``input_lists``
    external: array = field(default_factory=lambda: array("q"))
    threads: list = field(default_factory=list)   # code -> tid as kept (an int, or a string)
    kinds: list[EventKind] = field(default_factory=list)  # code -> what the pair is read as
    input_lists: list = field(default_factory=list)  # code -> (shapes, input types, non-tensor inputs) as kept
    # memory records ([memory] instants, read as rows of their own): their rows, bytes (an allocation > 0, a
    # free < 0) and device (code into ``devices``, labels as device_label makes them)
    memory_rows: array = field(default_factory=lambda: array("q"))
    memory_bytes: array = field(default_factory=lambda: array("q"))
    memory_device: array = field(default_factory=lambda: array("i"))
    devices: list[str] = field(default_factory=list)
    # runtime calls' and device events' rows, and CUPTI's correlation id that links a call to its kernels
    linked_rows: array = field(default_factory=lambda: array("q"))
    correlation: array = field(default_factory=lambda: array("q"))
    # record_param_comms' description of a collective it enqueues: its rows, elements, and (collective name, dtype)
    # as a code into ``comm_kinds``
    comm_rows: array = field(default_factory=lambda: array("q"))
    comm_elements: array = field(default_factory=lambda: array("q"))
    comm_kind: array = field(default_factory=lambda: array("i"))
    comm_kinds: list[tuple[str, str]] = field(default_factory=list)
    unfinished_rows: array = field(default_factory=lambda: array("q"))  # ranges kineto ended when profiling stopped
    events: int = 0  # every event of the file read, timed or not
    cut_strings: int = 0  # names and categories (of each event) cut to fields.TEXT_CHARS
    dropped: int = 0  # ops whose inputs were too many to keep (their shapes and types are left out)
    steps: bool = False  # a ProfilerStep marker was read
    kernels: bool = False  # a kernel, copy or memset was read
    flops: bool = False  # an op had torch's FLOPs count (profiled with_flops)


@dataclass
class _CheckedRow:
    """One event's values read from its dict, as the checked path keeps them (codes into the columns' lists)."""

    thread: int
    correlation: int
    external: int
    code: int = -1
    start: int = 0  # ns
    end: int = 0
    sequence: int = -1  # an op's (-1 on other events, as nothing reads theirs)
    inputs: int = 0
    nbytes: int = 0  # a memory record's, and its device's code
    device: int = 0
    comm: tuple[int, int] | None = None  # record_param_comms': elements, and the code of (collective, dtype)
    finished: bool = True


def read_table(path: str) -> tuple[EventTable, SlicedTraceReader]:
    """The trace file at ``path`` read into columns, and the reader that read it (its top level, what it left out)."""
    reader, reading = SlicedTraceReader(path), TableReading(path)
    with gc_paused():  # each slice makes thousands of objects, none in a cycle: the GC's passes would only cost time
        for batch in reader:
            reading(batch)
    reading.columns.cut_strings = reading.plain.check.cut
    return reading.columns, reader


class TableReading:
    """A trace's batches read into EventTable: a slice of typed records over its columns at once, and where a
    slice holds a value they do not take as it is (one the typed decoder refused, or one the checked path would
    refuse, cut or replace), its events one by one as the checked path reads them (fields.py), which raises its
    one-line error."""

    def __init__(self, path: str):
        self.plain = PlainFields(EventFields(path, share=True))
        self.columns = EventTable()
        self.codes = TableCodes(self.columns, self.plain)

    def __call__(self, batch) -> None:
        if batch.records is not None and self._read(batch.records):
            self.columns.events += len(batch.records)
            return
        events = batch.events()
        self.columns.events += len(events)
        for position, event in enumerate(events):
            self._read_checked(event, batch.first + position)

    def _read(self, records: list) -> bool:
        """Add a batch's timed records and memory records; False (nothing added) where one holds a value the
        columns do not take as it is."""
        timed = [r for r in records if r.ph == "X" or (r.ph == "i" and r.name == "[memory]")]
        if not timed:
            return True
        codes = self.codes
        kinds = codes.kinds([(r.name, r.cat) for r in timed])
        threads = codes.threads([r.tid for r in timed])
        if kinds is None or threads is None:
            return False
        args = [r.args or NO_ARGS for r in timed]
        cols = self.columns
        counted = [a.flops for a in args if a.flops]  # torch's own count: kept is that it was asked for
        if not all(0 <= value < INT_LIMIT for value in counted):  # (flops.py counts from the shapes)
            return False
        code = codes.input_code
        inputs = [0 if a.dims is EMPTY_LIST and a.dtypes is EMPTY_LIST and a.concrete is EMPTY_LIST else code(a)
                  for a in args]
        if None in inputs:
            return False
        try:
            ts, dur = array("d", [r.ts for r in timed]), array("d", [r.dur or 0.0 for r in timed])
            sequence = array("q", [a.sequence for a in args])
            correlation = array("q", [a.correlation for a in args])
            # kineto.external_id: ``External id``, else the name torch 1.8-1.9 wrote
            external = array("q", [a.external if a.external is not None else a.external_before_1_10 or 0
                                   for a in args])
        except (TypeError, OverflowError):  # None, or past 64 bits (signed)
            return False
        comms = self._comm_sizes(kinds, args) if codes.comm_kinds else []
        memory = [i for i, kind in enumerate(kinds) if kind in codes.memory_kinds] if codes.memory_kinds else []
        if comms is None or not _plain_times(ts, dur) or (memory and not self._memory(timed, memory, args)):
            return False
        if codes.cut_kinds:
            self.plain.check.cut += sum(codes.cut_kinds.get(kind, 0) for kind in kinds)
        for i, elements, comm in comms:
            self._add_comm(len(cols.start) + i, elements, comm)
        cols.unfinished_rows.extend([len(cols.start) + i for i, a in enumerate(args) if a.finished is False])
        cols.flops = cols.flops or bool(counted)
        cols.external += external
        if codes.linked_kinds:
            rows = [i for i, kind in enumerate(kinds) if kind in codes.linked_kinds]
            cols.linked_rows.extend([len(cols.start) + i for i in rows])
            cols.correlation.extend([correlation[i] for i in rows])
        start = ns_of(tensor_view(ts, torch.float64))
        append_values(cols.start, start)
        append_values(cols.end, start + (tensor_view(dur, torch.float64) * 1000).round().long())
        codes = array("i", kinds)
        cols.thread += array("i", threads)
        cols.kind += codes
        cols.sequence += sequence
        cols.inputs += array("i", inputs)
        return True

    def _comm_sizes(self, kinds: list[int], args: list) -> list[tuple[int, int, int]] | None:
        """(row in the slice, elements, code of (collective, dtype)) of each record_param_comms that says what it
        enqueues; None where one's values are not plain."""
        found, text = [], self.plain.text
        for i, kind in enumerate(kinds):
            a = args[i]
            if kind not in self.codes.comm_kinds or a.collective is UNSET or a.elements is UNSET:
                continue
            name, dtype = text(a.collective), text(a.dtype)
            if name is None or dtype is None or not 0 <= a.elements < INT_LIMIT:
                return None
            found.append((i, a.elements, self.codes.comm_code(name, dtype)))
        return found

    def _add_comm(self, row: int, elements: int, code: int) -> None:
        cols = self.columns
        cols.comm_rows.append(row)
        cols.comm_elements.append(elements)
        cols.comm_kind.append(code)

    def _read_checked(self, event, index: int) -> None:
        """One event from its dict, each value checked, cut or made printable as the checked path keeps it
        (the per-rank pass's checks first, in its order, then those of the fields the columns keep besides)."""
        check = self.plain.check
        check.event(event, index)
        phase = event.get("ph")
        if phase != "X" and (phase != "i" or event.get("name") != "[memory]"):
            return
        ts, dur = check.time(event, index, "ts"), check.time(event, index, "dur", 0.0)
        name = check.name(event, index)
        text = check.text(event.get("cat"), event, index, "'cat'")
        args = check.args(event, index)
        row = _CheckedRow(self.codes.thread_code(check.hashable(event.get("tid", 0), event, index, "'tid'")),
                          check.integer(args, "correlation", 0, event, index), external_id(args))
        if not -INT_LIMIT <= row.external < INT_LIMIT:
            raise check.refuse(event, index, 'args["External id"]', f"is {kind_of(row.external)}, not an integer")
        for key, value in (("ts", ts), ("dur", dur)):
            if not -TIME_LIMIT_US < value < TIME_LIMIT_US:
                raise check.refuse(event, index, f"'{key}'", f"is {value:.6g} µs, more than the {TIME_LIMIT_US:.3g} "
                                   "µs (73 years) from the clock's zero that a trace's times are read within")
        row.code = self.codes.kind_code(name, text)
        row.start = one_ns_of(ts)
        row.end = row.start + round(dur * 1000)
        if self.columns.kinds[row.code].cat == CPU_OP:
            row.sequence, lists_dropped = check.integer(args, "Sequence number", -1, event, index), check.dropped
            row.inputs = self.codes.kept_input_code((check.shapes(args, event, index),
                                                     check.texts(args, "Input type", event, index),
                                                     check.texts(args, "Concrete Inputs", event, index)))
            self.columns.dropped += check.dropped > lists_dropped
            self.columns.flops = bool(check.number(args, "flops", 0, event, index)) or self.columns.flops
            if name == "record_param_comms" and "Collective name" in args and "In msg nelems" in args:
                row.comm = (check.integer(args, "In msg nelems", 0, event, index, low=0),
                            self.codes.comm_code(check.text(args["Collective name"], event, index,
                                                            'args["Collective name"]'),
                                                 check.text(args.get("dtype"), event, index, 'args["dtype"]')))
        elif name == "[memory]":  # whatever its category: the checked path reads a memory record's size and device
            row.nbytes = check.integer(args, "Bytes", 0, event, index)
            device = (check.integer(args, "Device Type", 0, event, index, low=0),
                      check.integer(args, "Device Id", -1, event, index))
            if device[0] not in DEVICE_TYPES:
                raise check.refuse(event, index, 'args["Device Type"]', f"is {device[0]}, not a device type "
                                   f"torch knows ({min(DEVICE_TYPES)} to {max(DEVICE_TYPES)})")
            row.device = self.codes.devices([device])[0]
        row.finished = args.get("finished", True) is not False
        self._add_row(row)

    def _add_row(self, row: _CheckedRow) -> None:
        cols = self.columns
        if row.comm is not None:
            self._add_comm(len(cols.start), *row.comm)
        if not row.finished:
            cols.unfinished_rows.append(len(cols.start))
        if row.code in self.codes.linked_kinds:
            cols.linked_rows.append(len(cols.start))
            cols.correlation.append(row.correlation)
        if row.code in self.codes.memory_kinds:  # an instant: a memory record's end is its start, whatever its dur
            row.end = row.start
            cols.memory_rows.append(len(cols.start))
            cols.memory_bytes.append(row.nbytes)
            cols.memory_device.append(row.device)
        for column, value in ((cols.start, row.start), (cols.end, row.end), (cols.thread, row.thread),
                              (cols.kind, row.code), (cols.sequence, row.sequence), (cols.inputs, row.inputs),
                              (cols.external, row.external)):
            column.append(value)

    def _memory(self, timed: list, rows: list[int], args: list) -> bool:
        """Keep the batch's memory records (their ``rows``, bytes and device); False where one is not plain (a device
        type torch does not know), or has a duration (as written by kineto, none has)."""
        cols = self.columns
        if any(timed[i].dur for i in rows):
            return False
        devices = self.codes.devices([(args[i].device_type, args[i].device_id) for i in rows])
        try:
            nbytes = array("q", [args[i].nbytes for i in rows])
        except OverflowError:  # past 64 bits (signed)
            return False
        if devices is None:
            return False
        cols.memory_rows.extend([len(cols.start) + i for i in rows])
        cols.memory_bytes += nbytes
        cols.memory_device.extend(devices)
        return True


def ns_of(us: torch.Tensor) -> torch.Tensor:
    """Times in µs as ns, to the ns the floats hold: the whole µs and the fraction apart (kineto's µs since the
    epoch reach 1.7e15 in some traces, where µs x 1000 would pass 2**53 and round to 256 ns), rounded half to
    even."""
    whole = torch.floor(us)
    return whole.long() * 1000 + ((us - whole) * 1000).round().long()


def one_ns_of(us: float) -> int:
    """``ns_of`` of one time, the same float steps without a tensor (the checked path reads an event at a time:
    a tensor each cost 28 µs an event)."""
    whole = math.floor(us)
    return whole * 1000 + round((us - whole) * 1000)


def _plain_times(ts: array, dur: array) -> bool:
    """Times as the checked path keeps them (finite, durations not negative), checked over the whole slice at
    once (a NaN makes a bound's comparison false), and within ``TIME_LIMIT_US``."""
    starts, lengths = tensor_view(ts, torch.float64), tensor_view(dur, torch.float64)
    low, high = torch.aminmax(starts)
    shortest, longest = torch.aminmax(lengths)
    return bool(-TIME_LIMIT_US < low) and bool(high < TIME_LIMIT_US) and bool(0 <= shortest) \
        and bool(longest < TIME_LIMIT_US)
