"""One rank's operator-level report from its trace file, as ``%%torchprofile`` gives it.

The trace's events are read again and handed, one adapter object each, to the summary and rules
``%%torchprofile`` runs on the profiler's own events (profile/trace.py, profile/rules/): the same
categories, operator table and findings.  Unlike the cross-rank pass this holds every event of the
events at once (about 0.75 KB each), so it is done for a job of one rank, and over as many of its first
steps as fit in ``OPS_EVENT_LIMIT`` events.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from collections import Counter

from torch._C._autograd import DeviceType

from ....core.devices import DeviceInfo
from ....core.devices.cuda import tensor_core_precision

from ..result import ProfileResult
from ..rules import RuleContext
from ..build import summary_fields
from ..options import ProfileOptions
from ..kineto import (CPU_OP, DEVICE_ACTIVITIES, STEP_PREFIX, USER_ANNOTATION, activity, external_id, is_runtime,
                              unread_device)
from ..trace import summarize_trace
from .fields import MAX_INPUTS, EventFields
from .rank import RankTrace, step_number
from .reader import TraceReader, shown_path

OPS_EVENT_LIMIT = 300_000  # about 220 MB held, 6 s on the 2-core CPU machine
HELD_EVENTS_CAP = 3        # times that: first steps heavier than the average (and the slack after) hold more
_NO_DETAILS = (-1, (), (), (), 0, 0, (0, -1))
_DEVICE_TYPES = frozenset(int(t) for t in DeviceType.__members__.values())


class TraceEvent:
    """A Chrome-trace event with the accessors of torch's ``_KinetoEvent`` that the summary reads.

    Kineto writes an op's own id as ``External id``; a runtime call and the kernels it launched carry
    that op's id as ``External id`` too (``external id`` before torch 1.10), and CUPTI's ``correlation``
    between themselves.  Categories are read as the current schema names them (kineto.py)."""

    __slots__ = ("_name", "_cat", "_linked", "_start", "_dur", "_tid", "_external", "_correlation", "_sequence",
                 "_shapes", "_dtypes", "_concrete", "_flops", "_bytes", "_device")

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
            if self._device[0] not in _DEVICE_TYPES:
                raise check.refuse(event, index, 'args["Device Type"]', f"is {self._device[0]}, not a device type "
                                   f"torch knows ({min(_DEVICE_TYPES)} to {max(_DEVICE_TYPES)})")

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
        return [_literal(value) for value in self._concrete]

    def flops(self):
        return self._flops

    def nbytes(self):
        return self._bytes

    def device_type(self):
        return DeviceType(self._device[0])

    def device_index(self):
        return self._device[1]


def _literal(text):
    if not isinstance(text, str):
        return text
    try:
        return ast.literal_eval(text) if text else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def trace_profile(trace: RankTrace) -> ProfileResult | None:
    """The operator-level report of one rank's trace (read by rank.py already: its event count and
    steps say which steps fit in ``OPS_EVENT_LIMIT``); None if the first steps hold far more."""
    first, last, note = _steps_kept(trace)
    window = kept = None
    if first is not None:
        kept = (trace.steps[first][0], trace.steps[last][1])
        window = (kept[0], kept[1] + (kept[1] - kept[0]) / (last - first + 1))  # kernels may run past the step
    events: list[TraceEvent] = []
    reader = TraceReader(trace.path)
    check = EventFields(trace.path, share=True)
    for position, event in enumerate(reader):
        check.event(event, reader.index)
        phase = event.get("ph")
        if phase == "X" or (phase == "i" and event.get("name") == "[memory]"):
            read = TraceEvent(event, check.args(event, reader.index), check, reader.index)
            if window is not None and not window[0] * 1000 <= read._start <= window[1] * 1000:
                continue
            if window is not None and read._name.startswith(STEP_PREFIX) and \
                    step_number(read._name) not in range(first, last + 1):
                continue  # the step that begins in the slack after the last one kept
            events.append(read)
            if len(events) > HELD_EVENTS_CAP * OPS_EVENT_LIMIT:  # steps of very uneven size: the first hold too many
                return None
    if kept is not None:
        events = _launched_in(events, kept)
    start = min(e.start_ns() for e in events)
    notes = ["Read from a trace file: a step's time is its ProfilerStep range as recorded (the device was "
             "not synchronised at its end)."] + ([note] if note else [])
    if check.dropped:
        notes.append(f"Shapes and input types of {check.dropped:,} op(s) with over {MAX_INPUTS:,} inputs were "
                     "left out (their time is counted).")
    if not any(e.activity_type() == USER_ANNOTATION and e.name().startswith(STEP_PREFIX) for e in events):
        events.append(_whole_trace_marker(events, start))  # one step, on the thread that ran most ops
        notes.append("No ProfilerStep markers: the whole trace is read as one step.")
    device, context = _device(reader.meta, any(e.activity_type() in DEVICE_ACTIVITIES for e in events),
                              unread_device(trace.categories))
    summary = summarize_trace(events, start, shapes=any(e.shapes() for e in events),
                              flops=any(e.flops() for e in events))
    del events
    options = ProfileOptions(steps=len(summary.step_us),
                             record_shapes=any(stats.shapes for stats in summary.ops.values()))
    label = shown_path(os.path.basename(trace.path)) + (f" (rank {trace.rank})" if trace.rank is not None else "")
    fields = summary_fields(summary, context, len(summary.step_us), notes)
    return ProfileResult(label=label, device=device, step_s=[us / 1e6 for us in summary.step_us],
                         notes=notes, options=dataclasses.replace(options, memory=summary.memory_recorded,
                                                                  flops=any(s.flops for s in summary.ops.values())),
                         **fields)


def too_big_to_table(trace: RankTrace) -> str | None:
    """Why a trace gets no operator table: more events than can be held, and no steps to take some of."""
    if trace.events > OPS_EVENT_LIMIT and not trace.steps:
        return (f"No operator table: the trace has {trace.events:,} events and no ProfilerStep markers to table "
                f"the first {OPS_EVENT_LIMIT:,} or so by (call prof.step() once per iteration)")
    if trace.events > OPS_EVENT_LIMIT and trace.events / len(trace.steps) > OPS_EVENT_LIMIT:
        return (f"No operator table: the trace's {len(trace.steps)} step(s) hold {trace.events:,} events, more "
                f"than the {OPS_EVENT_LIMIT:,} or so held at once to table them")
    return None


def _steps_kept(trace: RankTrace) -> tuple[int | None, int | None, str | None]:
    """The first and last step whose events fit in the limit (None, None: all the trace's events)."""
    if trace.events <= OPS_EVENT_LIMIT:
        return None, None, None
    numbers = sorted(trace.steps)
    kept = max(1, int(OPS_EVENT_LIMIT / (trace.events / len(numbers))))
    if kept >= len(numbers):
        return None, None, None
    first, last = numbers[0], numbers[kept - 1]
    return first, last, (f"Operators from the first {kept} of the {len(numbers)} steps (about "
                         f"{OPS_EVENT_LIMIT:,} of the {trace.events:,} events, held at once to table them); "
                         "the per-rank figures above cover every step.")


def _launched_in(events: list[TraceEvent], kept: tuple[float, float]) -> list[TraceEvent]:
    """Kernels (and copies) launched within the kept steps: those the next step's CPU events launched
    (read in the slack after the last kept step) go too."""
    start, end = kept[0] * 1000, kept[1] * 1000  # µs on the file's clock; events keep ns
    inside = [e for e in events if e._cat not in DEVICE_ACTIVITIES and start <= e._start <= end]
    ops = {e._external for e in inside if not e._linked and e._external}
    launches = {e._correlation for e in inside if e._linked}
    return [e for e in events if e._cat not in DEVICE_ACTIVITIES or e._external in ops or e._correlation in launches]


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
