"""A live profile's events read into the columns a trace file is read into (traces/columns.py), so the cell's
report and the saved trace's come out of one analysis (traces/columnar.py).

Read from kineto's events, not through ``export_chrome_trace``: torch 2.13's writer names a range "unknown"
where its name holds a control character or anything not ASCII, drops a newline, turns a backslash into a
slash and writes a double quote unescaped (the file is then not JSON at all).  Times stay kineto's integer ns.
Each attribute read costs about 0.4 µs, so each event reads only what its kind needs.
"""

from __future__ import annotations

from .activity import activity_reader, is_hidden
from .events import DEVICE, MEMORY, OP, RUNTIME, event_kind
from .kineto import PYTHON_FUNCTION, STEP_PREFIX, USER_ANNOTATION
from .sweep import device_label
from .traffic import MATMUL_OPS
from .traces.columns import EventKind, TraceColumns
from .traces.rank import RankTrace

NO_INPUTS = ([], [], [])


class _Codes:
    """The codes a live profile's names, threads, inputs and memory devices get in its columns."""

    def __init__(self, cols: TraceColumns, every_op_inputs: bool):
        self.cols, self.every_op_inputs = cols, every_op_inputs
        self.kinds: dict[tuple[str, str], int | None] = {}  # (name, activity) -> code, None: set aside
        self.read_inputs: set[int] = set()  # the codes of ops whose inputs are read
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
            if light == OP and (self.every_op_inputs or name in MATMUL_OPS):
                self.read_inputs.add(code)
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


def live_columns(events, python_calls=(), *, every_op_inputs: bool = True) -> TraceColumns:
    """The columns of kineto's events (``prof.profiler.kineto_results.events()``) and of the Python tracer's
    calls where this torch keeps them apart (``activity.python_calls``).  Ops' inputs (shapes, types,
    non-tensor values) are read for every op with ``every_op_inputs`` (time by shapes, FLOPs), else for
    matmuls alone (their precision).  Events the summary sets aside are left out, and so are async and hidden
    ones (torch's own tables hide them too)."""
    cols = TraceColumns()
    codes = _Codes(cols, every_op_inputs)
    read_inputs = codes.read_inputs
    start, end, thread, kind, sequence, inputs, external = (cols.start, cols.end, cols.thread, cols.kind,
                                                            cols.sequence, cols.inputs, cols.external)
    activity_of = activity_reader(events[0] if len(events) else None)
    for e in events:
        try:
            name = e.name()
            activity = activity_of(e)
        except UnicodeDecodeError:  # torch 2.13's Python tracer garbles the names of some of its own frames
            continue
        code = codes.kind(name, activity)
        if code is None:
            continue
        light = cols.kinds[code].kind
        row = len(start)
        if light == DEVICE:
            tid, linked, own = e.device_resource_id(), e.correlation_id(), e.linked_correlation_id()
        elif light == MEMORY:
            tid, linked, own = e.start_thread_id(), None, 0
            cols.memory_rows.append(row)
            cols.memory_bytes.append(e.nbytes())
            cols.memory_device.append(codes.device(e.device_type(), e.device_index()))
        else:
            if e.is_async() or is_hidden(e):
                continue
            tid = e.start_thread_id()
            linked, own = (e.correlation_id(), e.linked_correlation_id()) if light == RUNTIME else (None,
                                                                                                  e.correlation_id())
        at = e.start_ns()
        start.append(at)
        end.append(at + (e.duration_ns() if light != MEMORY else 0))
        thread.append(codes.thread(tid))
        kind.append(code)
        external.append(own)
        if linked is not None:
            cols.linked_rows.append(row)
            cols.correlation.append(linked)
        if light == OP:
            sequence.append(e.sequence_nr())
            inputs.append(codes.input_code(_inputs(e)) if code in read_inputs else 0)
        else:
            sequence.append(-1)
            inputs.append(0)
    for name, at, stop, tid in python_calls:
        code = codes.kind(name, PYTHON_FUNCTION)
        if code is None:
            continue
        start.append(at)
        end.append(stop)
        thread.append(codes.thread(tid))
        kind.append(code)
        sequence.append(-1)
        inputs.append(0)
        external.append(0)
    return cols


def _inputs(e) -> tuple[list, list, list]:
    """An op's input shapes, types and non-tensor values (None for a tensor; torch before 2.1 records none)."""
    shapes = e.shapes()
    concrete = e.concrete_inputs() if hasattr(e, "concrete_inputs") else [None] * len(shapes)
    return shapes, e.dtypes(), concrete


def live_trace(cols: TraceColumns) -> RankTrace:
    """What the columnar summary reads of the per-rank pass for a live profile: its events, summarised as one
    group (kineto holds them all already)."""
    return RankTrace("profile", events=len(cols.start))

