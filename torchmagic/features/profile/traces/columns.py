"""A trace read into columns as the per-rank pass reads it: the operator report's input at the cost of a few
list comprehensions a slice (columnar.py summarises it without a loop over host events).

The per-rank pass's batches are read into columns a slice of typed records at once, and where a slice holds a
value the columns do not take as written (one the typed decoder refused, or one the checked path would refuse,
cut or replace; a name or category is cut or made printable within the slice, as that path keeps it), its
events one by one as the checked path (fields.py) reads them.  Every trace is read into columns, none is given
up on; a value the checked path refuses is raised after the per-rank pass's own error, which comes first.  Every
event is kept as a plain op, user range, Python frame, runtime call, kernel (or copy, or memset) or memory
record (or one the summary sets aside), each value as the checked path keeps it; an op's inputs (shapes, types,
non-tensor values) are kept once per distinct value, however written.  A live profile fills the same columns
from kineto's events (profile/live_columns.py).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import torch
from torch._C._autograd import DeviceType

from ....core.measure.low_precision import freeze
from ..array_views import append_values, tensor_view
from ..event_kinds import DEVICE, MEMORY, event_kind
from ..kineto import CPU_OP, DEVICE_ACTIVITIES, STEP_PREFIX, USER_ANNOTATION, activity, external_id, is_runtime
from .fields import DEVICE_TYPES, INT_LIMIT, EventFields
from .fields import kind as kind_of
from .reader import TraceFileError
from .records import EMPTY_LIST, NO_ARGS, PlainFields

# times whose ns, ends and differences all fit in int64 (the columns' type): ±2**61 ns, 73 years either side of
# the clock's zero (kineto writes µs since the epoch, 1.7e12 today); a time beyond is refused (_read_checked)
TIME_LIMIT_US = 2**61 / 1000


@dataclass
class EventKind:
    """What a (name, category) pair as written is read as."""

    name: str
    cat: str
    kind: int | None  # event_kinds.event_kind's


@dataclass
class TraceColumns:
    """A trace's timed events in file order: start and end in ns (the file's µs times 1000, rounded half to
    even; an end, the start plus the duration so rounded), thread (a device event's stream) and kind codes
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


@dataclass
class BatchColumns:
    """The batch just read, as columns: its timed records and memory records (``timed``), each one's kind code
    (``raw_kinds``: the (name, cat) each code stands for as written), start and duration (µs, as written), and
    CUPTI correlation id (0 for none): what the per-rank pass reads of it (rank.read_rank)."""

    timed: list
    kinds: array           # 'i'
    ts: array              # 'd'
    dur: array             # 'd'
    correlation: array     # 'q'
    raw_kinds: list[tuple]
    memory: list[int]      # the rows of memory records ('i' [memory]: those of a memory kind's code)


class ColumnReading:
    """The per-rank pass's batches read into TraceColumns (rank.read_rank's ``also``): a slice of typed records
    over its columns at once, and where a slice holds a value they do not take as it is (one the typed decoder
    refused, or one the checked path would refuse, cut or replace), its events one by one as the checked path
    reads them (fields.py).  A value that path refuses is kept (``refusal``) to be raised once the per-rank pass
    has read the file, whose own error comes first.  ``batch``: the last batch's columns where it was read as a
    slice (else None)."""

    def __init__(self, path: str):
        self.plain = PlainFields(EventFields(path, share=True))
        self.columns: TraceColumns | None = TraceColumns()
        self.refusal: TraceFileError | None = None
        self.dropped = 0  # ops whose inputs were too many to keep (their shapes and types are left out)
        self._kind_codes: dict[tuple, int | None] = {}  # (name, cat) as written -> code (None: read checked)
        self._kept_kinds: dict[tuple, int] = {}     # (name, cat) as kept -> code
        self._thread_codes: dict = {}              # tid as written -> code
        self._kept_threads: dict = {}              # tid as kept -> code
        self._input_codes: dict[tuple, int] = {}   # an op's inputs' texts -> code
        self._kept_inputs: dict[tuple, int] = {}   # an op's inputs as kept (lists as tuples) -> code
        self._device_codes: dict[tuple, int] = {}  # a memory record's (device type, index) -> code
        self._memory_kinds: set[int] = set()       # the kind codes of memory records
        self._linked_kinds: set[int] = set()       # ... of runtime calls and device events
        self._raw_kinds: list[tuple] = []          # code -> (name, cat) as written (as kept where read checked)
        self._kept_input_code(([], [], []))  # code 0: none recorded
        self.batch: BatchColumns | None = None

    def __call__(self, batch) -> None:
        self.batch = None
        if self.columns is None or self.refusal is not None:
            return
        if batch.records is None or not self._read(batch.records):
            try:
                for position, event in enumerate(batch.events()):
                    self._read_checked(event, batch.first + position)
            except TraceFileError as exc:
                self.refusal = exc

    def _read(self, records: list) -> bool:
        """Add a batch's timed records and memory records; False (nothing added) where one holds a value the
        columns do not take as it is."""
        timed = [r for r in records if r.ph == "X" or (r.ph == "i" and r.name == "[memory]")]
        if not timed:
            self.batch = BatchColumns([], array("i"), array("d"), array("d"), array("q"), self._raw_kinds, [])
            return True
        kinds = self._codes(self._kind_codes, [(r.name, r.cat) for r in timed], self._new_kind)
        threads = self._codes(self._thread_codes, [r.tid for r in timed], self._new_thread)
        if kinds is None or threads is None:
            return False
        args = [r.args or NO_ARGS for r in timed]
        cols = self.columns
        counted = [a.flops for a in args if a.flops]  # torch's own count: kept is that it was asked for
        if not all(0 <= value < INT_LIMIT for value in counted):  # (flops.py counts from the shapes)
            return False
        code = self._input_code
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
        memory = [i for i, kind in enumerate(kinds) if kind in self._memory_kinds] if self._memory_kinds else []
        if not _plain_times(ts, dur) or (memory and not self._memory(timed, memory, args)):
            return False
        cols.flops = cols.flops or bool(counted)
        cols.external += external
        if self._linked_kinds:
            rows = [i for i, kind in enumerate(kinds) if kind in self._linked_kinds]
            cols.linked_rows.extend([len(cols.start) + i for i in rows])
            cols.correlation.extend([correlation[i] for i in rows])
        start = (tensor_view(ts, torch.float64) * 1000).round().long()
        append_values(cols.start, start)
        append_values(cols.end, start + (tensor_view(dur, torch.float64) * 1000).round().long())
        codes = array("i", kinds)
        cols.thread += array("i", threads)
        cols.kind += codes
        cols.sequence += sequence
        cols.inputs += array("i", inputs)
        self.batch = BatchColumns(timed, codes, ts, dur, correlation, self._raw_kinds, memory)
        return True

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
        row = _CheckedRow(self._thread_code(check.hashable(event.get("tid", 0), event, index, "'tid'")),
                          check.integer(args, "correlation", 0, event, index), external_id(args))
        if not -INT_LIMIT <= row.external < INT_LIMIT:
            raise check.refuse(event, index, 'args["External id"]', f"is {kind_of(row.external)}, not an integer")
        for key, value in (("ts", ts), ("dur", dur)):
            if not -TIME_LIMIT_US < value < TIME_LIMIT_US:
                raise check.refuse(event, index, f"'{key}'", f"is {value:.6g} µs, more than the {TIME_LIMIT_US:.3g} "
                                   "µs (73 years) from the clock's zero that a trace's times are read within")
        row.code = self._kind_code(name, text, (name, text))
        row.start = round(ts * 1000)  # as a slice's are made ns (rounded half to even, as torch rounds)
        row.end = row.start + round(dur * 1000)
        if self.columns.kinds[row.code].cat == CPU_OP:
            row.sequence, lists_dropped = check.integer(args, "Sequence number", -1, event, index), check.dropped
            row.inputs = self._kept_input_code((check.shapes(args, event, index),
                                                check.texts(args, "Input type", event, index),
                                                check.texts(args, "Concrete Inputs", event, index)))
            self.dropped += check.dropped > lists_dropped
            self.columns.flops = bool(check.number(args, "flops", 0, event, index)) or self.columns.flops
        elif name == "[memory]":  # whatever its category: the checked path reads a memory record's size and device
            row.nbytes = check.integer(args, "Bytes", 0, event, index)
            device = (check.integer(args, "Device Type", 0, event, index, low=0),
                      check.integer(args, "Device Id", -1, event, index))
            if device[0] not in DEVICE_TYPES:
                raise check.refuse(event, index, 'args["Device Type"]', f"is {device[0]}, not a device type "
                                   f"torch knows ({min(DEVICE_TYPES)} to {max(DEVICE_TYPES)})")
            row.device = self._codes(self._device_codes, [device], self._new_device)[0]
        self._add_row(row)

    def _add_row(self, row: _CheckedRow) -> None:
        cols = self.columns
        if row.code in self._linked_kinds:
            cols.linked_rows.append(len(cols.start))
            cols.correlation.append(row.correlation)
        if row.code in self._memory_kinds:  # an instant: a memory record's end is its start, whatever its dur
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
        devices = self._codes(self._device_codes, [(args[i].device_type, args[i].device_id) for i in rows],
                              self._new_device)
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

    def _new_device(self, device: tuple[int, int]) -> int | None:
        kind, index = device
        if kind not in DEVICE_TYPES or not -INT_LIMIT <= index < INT_LIMIT:
            return None
        self.columns.devices.append(device_label(DeviceType(kind), index))
        return len(self.columns.devices) - 1

    def _input_code(self, args) -> int | None:
        """The code of an op's inputs as the checked path keeps them, or None where it would not keep them as
        written."""
        texts = bytes(args.dims), bytes(args.dtypes), bytes(args.concrete)
        code = self._input_codes.get(texts)
        if code is None:
            kept = self.plain.op_inputs(args)
            if kept is None:
                return None
            code = self._input_codes[texts] = self._kept_input_code(kept)
        return code

    def _kept_input_code(self, kept: tuple[list, list, list]) -> int:
        """The code of inputs as kept: one per distinct value, however it was written."""
        key = freeze(kept)
        code = self._kept_inputs.get(key)
        if code is None:
            code = self._kept_inputs[key] = len(self.columns.input_lists)
            self.columns.input_lists.append(kept)
        return code

    @staticmethod
    def _codes(codes: dict, keys: list, new) -> list[int] | None:
        """Each key's code, new ones made by ``new`` (None where a key is not covered)."""
        try:
            found = [codes[key] for key in keys]
        except KeyError:
            for key in keys:
                if key not in codes:
                    codes[key] = new(key)
            found = [codes[key] for key in keys]
        return None if None in found else found

    def _new_kind(self, pair: tuple) -> int | None:
        """The code of a slice's (name, cat), or None where the checked path reads more of such an event (a
        range, call or kernel named [memory]: its size and device)."""
        # as the checked path keeps them: a long name (a templated kernel's) cut, one not ASCII made printable
        name, text = (self.plain.check.text(value, {}, 0, "'name'") for value in pair)
        code = self._kind_code(name, text, pair)
        kept = self.columns.kinds[code]
        return None if name == "[memory]" and kept.kind != MEMORY and kept.cat != CPU_OP else code

    def _kind_code(self, name: str, text: str, pair: tuple) -> int:
        """The code of a (name, category) as kept, one per distinct pair (``pair``: as written, first seen)."""
        code = self._kept_kinds.get((name, text))
        if code is not None:
            return code
        cat = activity(text, name)
        kind = event_kind(cat, name)
        cols = self.columns
        cols.steps = cols.steps or (cat == USER_ANNOTATION and name.startswith(STEP_PREFIX))
        cols.kernels = cols.kernels or kind == DEVICE
        code = self._kept_kinds[name, text] = len(cols.kinds)
        cols.kinds.append(EventKind(name, cat, kind))
        self._raw_kinds.append(pair)
        if kind == MEMORY:
            self._memory_kinds.add(code)
        if cat in DEVICE_ACTIVITIES or is_runtime(cat):  # linked by CUPTI's correlation id (a name set aside too)
            self._linked_kinds.add(code)
        return code

    def _new_thread(self, tid) -> int | None:
        """The code of a slice's tid, or None where the checked path reads it (an integer past 64 bits)."""
        kept = self.plain.check.text(tid, {}, 0, "'tid'") if type(tid) is str else self.plain.tid(tid)
        return None if kept is None else self._thread_code(kept)

    def _thread_code(self, kept) -> int:
        code = self._kept_threads.get(kept)
        if code is None:
            code = self._kept_threads[kept] = len(self.columns.threads)
            self.columns.threads.append(kept)
        return code


def device_label(device_type: DeviceType, index: int) -> str:
    """A memory record's device, per device and never summed across GPUs: "cuda:1", as a Device's label reads."""
    return "cpu" if device_type == DeviceType.CPU else f"{str(device_type).rsplit('.', 1)[-1].lower()}:{max(index, 0)}"


def _plain_times(ts: array, dur: array) -> bool:
    """Times as PlainFields.times keeps them (finite, durations not negative), checked over the whole slice at
    once (a NaN makes a bound's comparison false), and within ``TIME_LIMIT_US``."""
    starts, lengths = tensor_view(ts, torch.float64), tensor_view(dur, torch.float64)
    low, high = torch.aminmax(starts)
    shortest, longest = torch.aminmax(lengths)
    return bool(-TIME_LIMIT_US < low) and bool(high < TIME_LIMIT_US) and bool(0 <= shortest) \
        and bool(longest < TIME_LIMIT_US)
