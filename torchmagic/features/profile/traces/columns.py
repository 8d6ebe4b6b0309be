"""A trace read into columns as the per-rank pass reads it: the operator report's input at the cost of a few
list comprehensions a slice (columnar.py summarises it without a loop over host events).

What the columnar summary covers is read here; anything else gives the reading up (its columns let go), and
the operator report is read as before (ops.py): a slice the typed decoder refused, or a value the checked path
would refuse, cut or replace (but a name or category, kept cut or made printable as that path keeps it).  So
where the columns are kept, every event is a plain op, user range, Python frame, runtime call, kernel (or
copy, or memset) or memory record (or one the summary sets aside), exactly as ops.py's typed path would have
made its TraceEvent; an op's inputs (shapes, types, non-tensor values) are kept once per distinct text, as
that path keeps them.  A live profile fills the same columns from kineto's events (profile/live_columns.py).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import torch
from torch._C._autograd import DeviceType

from ..array_views import append_values, tensor_view
from ..events import ANNOTATION, DEVICE, MEMORY, OP, PYTHON, RUNTIME, event_kind
from ..kineto import CPU_OP, DEVICE_ACTIVITIES, STEP_PREFIX, USER_ANNOTATION, activity, is_runtime
from ..sweep import device_label
from .fields import DEVICE_TYPES, INT_LIMIT, EventFields
from .records import EMPTY_LIST, LISTS_KEPT, NO_ARGS, PlainFields

# the light kinds the columnar summary reads (None: set aside)
IN_SCOPE = (OP, ANNOTATION, PYTHON, MEMORY, RUNTIME, DEVICE, None)
# times whose ns, ends and differences all fit in int64 (the columns' type): ±2**61 ns, 73 years either side of
# the clock's zero (kineto writes µs since the epoch, 1.7e12 today); a trace beyond is read as events
TIME_LIMIT_US = 2**61 / 1000


@dataclass
class EventKind:
    """What a (name, category) pair as written is read as."""

    name: str
    cat: str
    kind: int | None  # events.event_kind's


@dataclass
class TraceColumns:
    """A trace's timed events in file order: start and end in ns (as ops.TraceEvent rounds the file's µs),
    thread (a device event's stream) and kind codes (``threads``, ``kinds`` give what they stand for),
    autograd sequence numbers, and the op each belongs to (``External id``: an op's own, a runtime call's or a
    kernel's launching op's)."""

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
    # free < 0) and device (code into ``devices``, labels as sweep.device_label makes them)
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
    """The per-rank pass's batches read into TraceColumns (rank.read_rank's ``also``), until one holds what
    the columnar summary does not cover: then it gives up, and ``columns`` is None.  ``batch``: the last
    batch's columns, where it was read (else None)."""

    def __init__(self, path: str):
        self.plain = PlainFields(EventFields(path, share=True))
        self.columns: TraceColumns | None = TraceColumns()
        self._kind_codes: dict[tuple, int] = {}   # (name, cat) as written -> code
        self._thread_codes: dict = {}              # tid as written -> code
        self._input_codes: dict[tuple, int] = {}   # an op's inputs' texts -> code
        self._device_codes: dict[tuple, int] = {}  # a memory record's (device type, index) -> code
        self._memory_kinds: set[int] = set()       # the kind codes of memory records
        self._linked_kinds: set[int] = set()       # ... of runtime calls and device events
        self._raw_kinds: list[tuple] = []          # code -> (name, cat) as written
        self._input_code(NO_ARGS)  # code 0: none recorded
        self.batch: BatchColumns | None = None

    def __call__(self, batch) -> None:
        self.batch = None
        if self.columns is None:
            return
        if batch.records is None or not self._read(batch.records):
            self.columns = None
            self._kind_codes = self._thread_codes = self._input_codes = self._device_codes = {}

    def _read(self, records: list) -> bool:
        """Add a batch's timed records and memory records; False where one is outside what the columns cover."""
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
        if counted:  # (flops.py counts from the shapes); a value the checked path refuses gives the columns up
            if not all(0 <= value < INT_LIMIT for value in counted):
                return False
            cols.flops = True
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
        except (TypeError, OverflowError):  # None, or past 64 bits (signed), as the checked path refuses them
            return False
        memory = [i for i, kind in enumerate(kinds) if kind in self._memory_kinds] if self._memory_kinds else []
        if not _plain_times(ts, dur) or (memory and not self._memory(timed, memory, args)):
            return False
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
        except OverflowError:  # past 64 bits (signed): the checked path refuses it
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
        written (or too many distinct ones were seen)."""
        texts = bytes(args.dims), bytes(args.dtypes), bytes(args.concrete)
        code = self._input_codes.get(texts)
        if code is None:
            kept = self.plain.op_inputs(args)
            if kept is None or len(self._input_codes) >= LISTS_KEPT:
                return None
            code = self._input_codes[texts] = len(self.columns.input_lists)
            self.columns.input_lists.append(kept)
        return code

    @staticmethod
    def _codes(codes: dict, keys: list, new) -> list[int] | None:
        """Each key's code, new ones made by ``new`` (None where a key is not covered)."""
        try:
            return [codes[key] for key in keys]
        except KeyError:
            pass
        for key in keys:
            if key not in codes:
                code = new(key)
                if code is None:
                    return None
                codes[key] = code
        return [codes[key] for key in keys]

    def _new_kind(self, pair: tuple) -> int | None:
        # as the checked path keeps them: a long name (a templated kernel's) cut, one not ASCII made printable
        name, text = (self.plain.check.text(value, {}, 0, "'name'") for value in pair)
        if len(self._kind_codes) >= LISTS_KEPT:
            return None
        cat = activity(text, name)
        kind = event_kind(cat, name)
        if kind not in IN_SCOPE or (name == "[memory]" and kind != MEMORY and cat != CPU_OP):
            return None  # a range, call or kernel named [memory]: the checked path reads its size and device too
        cols = self.columns
        cols.steps = cols.steps or (cat == USER_ANNOTATION and name.startswith(STEP_PREFIX))
        cols.kernels = cols.kernels or kind == DEVICE
        cols.kinds.append(EventKind(name, cat, kind))
        self._raw_kinds.append(pair)
        if kind == MEMORY:
            self._memory_kinds.add(len(cols.kinds) - 1)
        if cat in DEVICE_ACTIVITIES or is_runtime(cat):  # linked by CUPTI's correlation id (a name set aside too)
            self._linked_kinds.add(len(cols.kinds) - 1)
        return len(cols.kinds) - 1

    def _new_thread(self, tid) -> int | None:
        kept = self.plain.tid(tid)
        if kept is None or len(self._thread_codes) >= LISTS_KEPT:
            return None
        self.columns.threads.append(kept)
        return len(self.columns.threads) - 1


def _plain_times(ts: array, dur: array) -> bool:
    """Times as PlainFields.times keeps them (finite, durations not negative), checked over the whole slice at
    once (a NaN makes a bound's comparison false), and within ``TIME_LIMIT_US``."""
    starts, lengths = tensor_view(ts, torch.float64), tensor_view(dur, torch.float64)
    low, high = torch.aminmax(starts)
    shortest, longest = torch.aminmax(lengths)
    return bool(-TIME_LIMIT_US < low) and bool(high < TIME_LIMIT_US) and bool(0 <= shortest) \
        and bool(longest < TIME_LIMIT_US)
