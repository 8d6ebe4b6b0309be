"""A live profile's events read into the columns a trace file is read into (traces/event_table.py), so the cell's
report and the saved trace's come out of one analysis (traces/table_summary.py).

Read from kineto's events, not through ``export_chrome_trace``: torch 2.13's writer names a range "unknown"
where its name holds a control character or anything not ASCII, drops a newline, turns a backslash into a
slash and writes a double quote unescaped (the file is then not JSON at all).  Times stay kineto's integer ns.
Each attribute read costs about 0.4 µs, so each event reads only what its kind needs.
"""

from __future__ import annotations

from ...core.gc_pause import gc_paused
from .activity import activity_reader
from .event_kinds import DEVICE, MEMORY, OP, RUNTIME, event_kind
from .kineto import PYTHON_FUNCTION, STEP_PREFIX, USER_ANNOTATION
from .summary import TraceSummary
from .traffic import MATMUL_OPS
from .traces.table_summary import summarize_table
from .traces.table_codes import EventKind, device_label
from .traces.event_table import EventTable

NO_INPUTS = ([], [], [])


class _Codes:
    """The codes a live profile's names, threads, inputs and memory devices get in its columns."""

    def __init__(self, cols: EventTable, shapes: bool, flops: bool):
        self.cols, self.shapes, self.flops = cols, shapes, flops
        self.kinds: dict[tuple[str, str], int | None] = {}  # (name, activity) -> code, None: set aside
        self.all_inputs: set[int] = set()   # the codes of ops whose inputs are read whole
        self.shapes_only: set[int] = set()  # ... of those whose shapes alone are
        self.threads: dict = {}
        self.inputs: dict = {}
        self.devices: dict = {}
        self.input_code(NO_INPUTS)  # code 0: none recorded

    def kind(self, name: str, activity: str) -> int | None:
        code = self.kinds.get((name, activity), -1)
        if code != -1:
            return code
        light = event_kind(activity, name)
        code = None
        if light is not None:
            cols = self.cols
            cols.kinds.append(EventKind(name, activity, light))
            code = len(cols.kinds) - 1
            cols.steps = cols.steps or (activity == USER_ANNOTATION and name.startswith(STEP_PREFIX))
            cols.kernels = cols.kernels or light == DEVICE
            if light == OP and (self.flops or name in MATMUL_OPS):  # FLOPs, bytes; a matmul's precision
                self.all_inputs.add(code)
            elif light == OP and self.shapes:  # time by shapes
                self.shapes_only.add(code)
        self.kinds[name, activity] = code
        return code

    def thread(self, tid) -> int:
        code = self.threads.get(tid)
        if code is None:
            self.cols.threads.append(tid)
            code = self.threads[tid] = len(self.cols.threads) - 1
        return code

    def input_code(self, inputs: tuple[list, list, list]) -> int:
        key = repr(inputs)  # lists of ints, strings, numbers and None: distinct inputs, distinct texts
        code = self.inputs.get(key)
        if code is None:
            self.cols.input_lists.append(inputs)
            code = self.inputs[key] = len(self.cols.input_lists) - 1
        return code

    def device(self, device_type, index: int) -> int:
        code = self.devices.get((device_type, index))
        if code is None:
            self.cols.devices.append(device_label(device_type, index))
            code = self.devices[device_type, index] = len(self.cols.devices) - 1
        return code


def live_table(events, python_calls=(), *, shapes: bool = True, flops: bool = True) -> EventTable:
    """The columns of kineto's events (``prof.profiler.kineto_results.events()``) and of the Python tracer's
    calls where this torch keeps them apart (``activity.python_calls``), in kineto's order.  Ops' inputs
    (shapes, types, non-tensor values) are read where they are needed: matmuls' always (their precision), every
    op's with ``flops``, every op's shapes alone with ``shapes`` (time by shapes).  Events the summary sets
    aside are left out, and so are async and hidden ones (torch's own tables hide them too).  Each attribute
    is read over all events at once: a comprehension per attribute costs half a loop that reads them all per
    event."""
    cols = EventTable()
    codes = _Codes(cols, shapes, flops)
    kept, kinds = _kept(events, codes)
    light = [cols.kinds[code].kind for code in kinds]
    starts = [e.start_ns() for e in kept]
    cols.start.extend(starts)
    cols.end.extend([at + e.duration_ns() if k != MEMORY else at for e, at, k in zip(kept, starts, light)])
    cols.thread.extend([codes.thread(e.device_resource_id() if k == DEVICE else e.start_thread_id())
                        for e, k in zip(kept, light)])
    cols.kind.extend(kinds)
    own = [e.correlation_id() for e in kept]  # an op's (and a range's) own id; CUPTI's on a linked event
    linked = [row for row, k in enumerate(light) if k == DEVICE or k == RUNTIME]
    cols.linked_rows.extend(linked)
    cols.correlation.extend([own[row] for row in linked])
    for row in linked:  # a runtime call's or a kernel's External id: the op that launched it
        own[row] = kept[row].linked_correlation_id()
    memory = [row for row, k in enumerate(light) if k == MEMORY]
    for row in memory:  # a memory record belongs to no op by id
        own[row] = 0
    cols.external.extend(own)
    whole, shaped = codes.all_inputs, codes.shapes_only
    cols.sequence.extend([e.sequence_nr() if k == OP else -1 for e, k in zip(kept, light)])
    cols.inputs.extend([codes.input_code(_inputs(e)) if code in whole else
                        codes.input_code((e.shapes(), [], [])) if code in shaped else 0
                        for e, code in zip(kept, kinds)])
    cols.memory_rows.extend(memory)
    cols.memory_bytes.extend([kept[row].nbytes() for row in memory])
    cols.memory_device.extend([codes.device(kept[row].device_type(), kept[row].device_index()) for row in memory])
    for name, at, stop, tid in python_calls:
        code = codes.kind(name, PYTHON_FUNCTION)
        if code is not None:
            for column, value in ((cols.start, at), (cols.end, stop), (cols.thread, codes.thread(tid)),
                                  (cols.kind, code), (cols.sequence, -1), (cols.inputs, 0), (cols.external, 0)):
                column.append(value)
    return cols


def _kept(events, codes: _Codes) -> tuple[list, list[int]]:
    """The events the summary reads, with their kind codes."""
    activity_of = activity_reader(events[0] if len(events) else None)
    try:
        pairs = [(e.name(), activity_of(e)) for e in events]
    except UnicodeDecodeError:  # torch 2.13's Python tracer garbles the names of some of its own frames
        pairs = [_pair(e, activity_of) for e in events]
    kind = codes.kind
    coded = [(e, kind(*pair)) for e, pair in zip(events, pairs) if pair is not None]
    kept = [(e, code) for e, code in coded if code is not None]
    hidden = hasattr(events[0], "is_hidden_event") if len(events) else False
    host = {code for code, k in enumerate(codes.cols.kinds) if k.kind not in (DEVICE, MEMORY)}
    kept = [(e, code) for e, code in kept
            if code not in host or not (e.is_async() or (hidden and e.is_hidden_event()))]
    return [e for e, _ in kept], [code for _, code in kept]


def _pair(e, activity_of) -> tuple[str, str] | None:
    try:
        return e.name(), activity_of(e)
    except UnicodeDecodeError:
        return None


def _inputs(e) -> tuple[list, list, list]:
    """An op's input shapes, types and non-tensor values (None for a tensor; torch before 2.1 records none)."""
    shapes = e.shapes()
    concrete = e.concrete_inputs() if hasattr(e, "concrete_inputs") else [None] * len(shapes)
    return shapes, e.dtypes(), concrete


def summarize_live(results, *, shapes: bool = False, flops: bool = False,
                   python_calls=()) -> tuple[TraceSummary, int] | None:
    """The summary of a stopped profiler's ``kineto_results`` (``shapes``: ops' time kept by their shapes;
    ``flops``: FLOPs counted) and the profiler clock's ns at its time zero (its first event); None where the
    profiler recorded nothing the summary reads."""
    events = results.events()
    with gc_paused():  # lists of every event, none in a cycle: the cyclic GC's passes would only cost time
        columns = live_table(events, python_calls, shapes=shapes, flops=flops)
        if not len(columns.start):
            return None
        # one group: kineto holds every event already
        summary, first_ns, _ = summarize_table(columns, len(columns.start), flops, shapes)
    summary.event_count = len(events) + len(python_calls)
    return summary, first_ns
