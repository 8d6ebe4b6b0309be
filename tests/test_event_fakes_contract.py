"""Each stand-in for torch's kineto event held against the real one (``_KinetoEvent``, what
``prof.profiler.kineto_results.events()`` returns): the tests' hand-built events (profile/kineto_fakes.py)
and the trace-file reader's adapter (traces/ops.py's TraceEvent), which the summary reads as if kineto had
given them.  The methods held are those the package is seen to read: it runs here on recording proxies
around a real CPU run's events, around the fakes' GPU scenario, and over that run's exported trace.
What a stand-in lacks, or returns of another kind, is listed with why; any other drift fails here."""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from torch._C._autograd import DeviceType, _KinetoEvent
from torch.profiler import ProfilerActivity, profile, record_function

from torchmagic.features.profile import activity, kineto
from torchmagic.features.profile.live_columns import summarize_live
from torchmagic.features.profile.traces import ops, run
from torchmagic.features.profile.traces.fields import EventFields
from torchmagic.features.profile.traces.reader import TraceReader

from .profile import kineto_fakes
from .profile.kineto_fakes import Ev, FakeResults, Torch211Event
from .profile.test_gpu_trace import EVENTS as GPU_SCENARIO

STAND_INS = (Ev, ops.TraceEvent, Torch211Event)

# What a stand-in lacks of what the package reads, and why
LACKS = {
    "TraceEvent.is_hidden_event": "a trace file holds the events torch shows; activity.is_hidden reads the flag "
                                  "only where an event has it",
}

# What a stand-in returns beyond the real method's declared type, and why
WIDER_RETURNS = {
    "TraceEvent.shapes": ("list[list[int] | list[list[int]]] | tuple[()]",
                          "a trace file writes a tensor list's sizes, one list per tensor (the event gives []); "
                          "() on events other than ops, as below"),
    "TraceEvent.dtypes": ("list[str] | tuple[()]", "on events other than ops, one shared empty tuple: nothing reads "
                          "it there, and a list each would cost memory on the 300k events held"),
    "TraceEvent.start_thread_id": ("int | str", "a trace file may name a thread with a string"),
    "TraceEvent.device_resource_id": ("int | str", "a kernel's stream is the trace's thread, which may be a string"),
    "TraceEvent.flops": ("int | float", "a trace another tool wrote may count FLOPs as a fraction"),
}

# Methods some supported torch (2.7 onwards) lacks: a stand-in may have them where the real event has not
LATER_TORCH = {
    "activity_type": "torch 2.13 added it; activity.py infers the type before",
    "is_python_function": "activity.py reads the Python tracer's calls from the event tree before",
}


class _Recording:
    """An event that notes each attribute the package reads of it."""

    __slots__ = ("_event", "_read")

    def __init__(self, event, read: set):
        self._event, self._read = event, read

    def __getattr__(self, name):
        self._read.add(name)
        return getattr(self._event, name)


def _readable(e) -> bool:
    try:
        return bool(e.name())
    except UnicodeDecodeError:  # torch 2.13's Python tracer garbles a name now and then (see events.py)
        return False


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A tiny real CPU step's events (ops with shapes and FLOPs, memory, Python calls, a tensor list),
    its start, and its exported Chrome trace."""
    model = torch.nn.Linear(8, 4)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True, with_stack=True,
                 profile_memory=True) as prof:
        with record_function("ProfilerStep#0"):
            x = torch.cat([torch.randn(2, 8), torch.randn(2, 8)])
            model(x).square().mean().backward()
    path = str(tmp_path_factory.mktemp("trace") / "run.json")
    prof.export_chrome_trace(path)
    results = prof.profiler.kineto_results
    return [e for e in results.events() if _readable(e)], results.trace_start_ns(), path


def _trace_events(path: str) -> list:
    """The trace file's events as traces/ops.py reads them."""
    reader, check = TraceReader(path), EventFields(path)
    return [ops.TraceEvent(event, check.args(event, reader.index), check, reader.index) for event in reader
            if event.get("ph") == "X" or (event.get("ph") == "i" and event.get("name") == "[memory]")]


def _memory_event():
    return Ev("[memory]", 500, 500, kind="memory", nbytes=64)


@pytest.fixture(scope="module")
def read(real):
    """What the package reads of each stand-in's events, as recorded on proxies."""
    events, start, path = real
    summary, inference, adapter = set(), set(), set()
    for recorded in (events, GPU_SCENARIO + [_memory_event()]):  # the live path (live_columns.py)
        summarize_live(FakeResults([_Recording(e, summary) for e in recorded]), shapes=True, flops=True)
    for e in events[:200] + GPU_SCENARIO:  # a torch 2.11 event (Torch211Event) goes to this inference alone
        activity.inferred_activity(_Recording(e, inference))

    class RecordingTraceEvent(ops.TraceEvent):  # what traces/ops.py reads of its adapter, and the summary
        __slots__ = ()

        def __getattribute__(self, name):
            if not name.startswith("_"):
                adapter.add(name)
            return super().__getattribute__(name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ops, "TraceEvent", RecordingTraceEvent)
        assert run.analyze_traces(path).profile is not None
    # the adapter goes to the summary as kineto's events do: what it reads on the GPU paths too
    return {Ev: summary, ops.TraceEvent: adapter | summary, Torch211Event: inference}


def _declared(name: str) -> tuple[list[str], str]:
    """A real method's parameters and return type, as its pybind docstring declares them."""
    doc = (getattr(_KinetoEvent, name).__doc__ or "").strip().splitlines()[0]
    found = re.fullmatch(rf"{name}\((.*)\) -> (.+)", doc)
    assert found, f"_KinetoEvent.{name}: no signature in its docstring ({doc!r})"
    return [p.split(":")[0].strip() for p in found.group(1).split(",") if p.strip()], found.group(2)


def _alternatives(annotation: str) -> list[str]:
    """``a | b`` split where not inside brackets."""
    parts, depth, begin = [], 0, 0
    for i, c in enumerate(annotation):
        depth += (c == "[") - (c == "]")
        if c == "|" and depth == 0:
            parts.append(annotation[begin:i].strip())
            begin = i + 1
    return parts + [annotation[begin:].strip()]


_SCALARS = {"int": lambda v: type(v) is int, "str": lambda v: type(v) is str, "bool": lambda v: type(v) is bool,
            "float": lambda v: type(v) is float, "object": lambda v: True, "list": lambda v: type(v) is list,
            "tuple[()]": lambda v: v == (),
            "torch._C._autograd.DeviceType": lambda v: isinstance(v, DeviceType)}


def _conforms(value, annotation: str) -> bool:
    """Whether ``value`` is of the declared type (``list[list[int]]``, ``int | str`` ...)."""
    for kind in _alternatives(annotation):
        if kind.startswith("list[") and kind.endswith("]"):
            if type(value) is list and all(_conforms(item, kind[5:-1]) for item in value):
                return True
        elif kind not in _SCALARS:
            raise AssertionError(f"a return type this test does not know: {kind} (add it to _SCALARS)")
        elif _SCALARS[kind](value):
            return True
    return False


def _methods(cls) -> set[str]:
    return {name for klass in cls.__mro__[:-1] for name, value in vars(klass).items()
            if not name.startswith("_") and callable(value)}


def test_the_package_reads_only_what_kineto_events_have(read):
    everything = set().union(*read.values())
    # the recording saw the CPU, GPU and memory paths (traces/ops.py reads a typed record's flops as it makes
    # the adapter, not through flops(): no path of this run calls it)
    assert {"name", "start_ns", "shapes", "dtypes", "linked_correlation_id", "device_resource_id",
            "correlation_id", "nbytes", "device_type"} <= everything
    missing = {name for name in everything if not hasattr(_KinetoEvent, name) and name not in LATER_TORCH}
    assert not missing, f"the package reads what torch's kineto events do not have: {sorted(missing)}"


@pytest.mark.parametrize("stand_in", STAND_INS, ids=lambda cls: cls.__name__)
def test_a_stand_in_has_only_kinetos_methods_with_their_parameters(stand_in):
    for name in _methods(stand_in):
        if not hasattr(_KinetoEvent, name):
            assert name in LATER_TORCH, f"{stand_in.__name__}.{name}: torch's kineto events have no such method"
            continue
        ours = [p.name for p in inspect.signature(getattr(stand_in, name)).parameters.values()]
        assert ours == _declared(name)[0], (f"{stand_in.__name__}.{name}", ours, _declared(name)[0])


@pytest.mark.parametrize("stand_in", STAND_INS, ids=lambda cls: cls.__name__)
def test_a_stand_in_has_what_the_package_reads_of_it(stand_in, read):
    listed = {key.split(".")[1] for key in LACKS if key.startswith(f"{stand_in.__name__}.")}
    lacking = read[stand_in] - _methods(stand_in)
    assert lacking <= listed, f"{stand_in.__name__} lacks {sorted(lacking - listed)}, which the package reads"
    assert not listed & _methods(stand_in), f"{stand_in.__name__} has {sorted(listed & _methods(stand_in))} now"
    assert listed <= read[stand_in], f"{stand_in.__name__}: {sorted(listed - read[stand_in])} no longer read"


def _checked_returns(event, names, label: str, wider: dict | None = None) -> list[str]:
    """The methods of ``event`` whose value is not of the type the real method declares."""
    wrong = []
    for name in names:
        declared = (wider or {}).get(f"{label}.{name}", (_declared(name)[1],))[0]
        value = getattr(event, name)()
        if not _conforms(value, declared):
            wrong.append(f"{label}.{name}() -> {value!r}, not {declared}")
    return wrong


def test_real_events_return_what_their_methods_declare(real, read):
    """The check the stand-ins' returns meet, on the real thing first."""
    names = sorted(n for n in set().union(*read.values()) if hasattr(_KinetoEvent, n))
    wrong = [w for e in real[0] for w in _checked_returns(e, names, "_KinetoEvent")]
    assert not wrong, wrong[:5]


def test_stand_ins_return_what_the_real_methods_declare(real):
    samples = {Ev: GPU_SCENARIO + [_memory_event()], ops.TraceEvent: _trace_events(real[2]),
               Torch211Event: [Torch211Event("kernel"), Torch211Event("cudaLaunchKernel", DeviceType.CPU)]}
    wrong = []
    for stand_in, events in samples.items():
        names = sorted(_methods(stand_in) & set(dir(_KinetoEvent)))  # all it has, read or not
        wrong += [w for e in events for w in _checked_returns(e, names, stand_in.__name__, WIDER_RETURNS)]
    assert not wrong, wrong[:5]


def test_each_wider_return_is_wider_than_torchs():
    for key, (annotation, _) in WIDER_RETURNS.items():
        assert annotation != _declared(key.split(".")[1])[1], f"{key}: torch declares {annotation} now: drop it"


def test_the_trace_adapter_reads_what_the_same_run_gave_as_events(real):
    """The adapter over a run's exported trace answers as that run's events did, op by op."""
    events, _, path = real
    kind = activity.activity_reader()  # torch's own answer, or inferred on a torch before 2.13
    ops_by_id = {e.correlation_id(): e for e in events if kind(e) == kineto.CPU_OP}
    adapted = [e for e in _trace_events(path) if e.activity_type() == kineto.CPU_OP]
    assert len(adapted) == len(ops_by_id) > 10
    for ours in adapted:
        theirs = ops_by_id[ours.correlation_id()]
        tensor_list = "TensorList" in theirs.dtypes()  # see WIDER_RETURNS
        # not flops(): torch 2.13's export writes no "flops" argument, even with with_flops=True
        for name in ("name", "dtypes", "sequence_nr", "concrete_inputs") + (() if tensor_list else ("shapes",)):
            assert getattr(ours, name)() == getattr(theirs, name)(), (ours.name(), name)
    memory = [e.nbytes() for e in events if e.name() == "[memory]"]
    assert [e.nbytes() for e in _trace_events(path) if e.name() == "[memory]"] == memory


def test_the_enums_and_activity_types_the_stand_ins_use_are_torchs(real):
    assert kineto_fakes.DeviceType is DeviceType and ops.DeviceType is DeviceType
    stand_ins = GPU_SCENARIO + [_memory_event()] + _trace_events(real[2])
    assert {type(e.device_type()) for e in stand_ins} == {DeviceType}
    # every activity type a real CPU run gives, and every one the stand-ins give, is kineto's (kineto.py's names)
    known = lambda kind: kineto.is_read(kind) or kind in kineto.UNREAD_ON_PURPOSE  # noqa: E731
    real_kinds = {e.activity_type() for e in real[0]} if hasattr(_KinetoEvent, "activity_type") else set()
    assert all(map(known, real_kinds)), real_kinds
    ours = {e.activity_type() for e in stand_ins} | {activity.inferred_activity(e) for e in GPU_SCENARIO}
    assert all(map(known, ours)), ours
    assert real_kinds & {e.activity_type() for e in _trace_events(real[2])} == real_kinds
