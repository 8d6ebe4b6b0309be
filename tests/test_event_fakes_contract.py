"""Each stand-in for torch's kineto event held against the real one (``_KinetoEvent``, what
``prof.profiler.kineto_results.events()`` returns): the tests' hand-built events (profile/kineto_fakes.py), which
the live profile's reading (live_table.py) reads as if kineto had given them.  The methods held are those the
package is seen to read: it runs here on recording proxies around a real CPU run's events and around the fakes'
GPU scenario.  Any drift fails here.  That run's exported trace,
read into columns as any trace file is, holds what its events did."""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from torch._C._autograd import DeviceType, _KinetoEvent
from torch.profiler import ProfilerActivity, profile, record_function

from torchmagic.features.profile import activity, kineto
from torchmagic.core.measure.low_precision import freeze
from torchmagic.features.profile.live_table import live_table, summarize_live
from torchmagic.features.profile.traces.event_table import read_table

from .profile import kineto_fakes
from .profile.kineto_fakes import Ev, FakeResults, Torch211Event
from .profile.test_gpu_trace import EVENTS as GPU_SCENARIO

STAND_INS = (Ev, Torch211Event)

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


def _memory_event():
    return Ev("[memory]", 500, 500, kind="memory", nbytes=64)


@pytest.fixture(scope="module")
def read(real):
    """What the package reads of each stand-in's events, as recorded on proxies."""
    events, start, path = real
    summary, inference = set(), set()
    for recorded in (events, GPU_SCENARIO + [_memory_event()]):  # the live path (live_table.py)
        summarize_live(FakeResults([_Recording(e, summary) for e in recorded]), shapes=True, flops=True)
    for e in events[:200] + GPU_SCENARIO:  # a torch 2.11 event (Torch211Event) goes to this inference alone
        activity.inferred_activity(_Recording(e, inference))
    return {Ev: summary, Torch211Event: inference}


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
    lacking = read[stand_in] - _methods(stand_in)
    assert not lacking, f"{stand_in.__name__} lacks {sorted(lacking)}, which the package reads"


def _checked_returns(event, names, label: str) -> list[str]:
    """The methods of ``event`` whose value is not of the type the real method declares."""
    wrong = []
    for name in names:
        declared = _declared(name)[1]
        value = getattr(event, name)()
        if not _conforms(value, declared):
            wrong.append(f"{label}.{name}() -> {value!r}, not {declared}")
    return wrong


def test_real_events_return_what_their_methods_declare(real, read):
    """The check the stand-ins' returns meet, on the real thing first."""
    names = sorted(n for n in set().union(*read.values()) if hasattr(_KinetoEvent, n))
    wrong = [w for e in real[0] for w in _checked_returns(e, names, "_KinetoEvent")]
    assert not wrong, wrong[:5]


def test_stand_ins_return_what_the_real_methods_declare():
    samples = {Ev: GPU_SCENARIO + [_memory_event()],
               Torch211Event: [Torch211Event("kernel"), Torch211Event("cudaLaunchKernel", DeviceType.CPU)]}
    wrong = []
    for stand_in, events in samples.items():
        names = sorted(_methods(stand_in) & set(dir(_KinetoEvent)))  # all it has, read or not
        wrong += [w for e in events for w in _checked_returns(e, names, stand_in.__name__)]
    assert not wrong, wrong[:5]


def _ops_and_memory(columns) -> tuple[list, list]:
    """The ops of a run's columns (name, sequence number, input types, shapes where no input is a tensor list),
    in order, and its memory records' bytes."""
    ops = []
    for row, code in enumerate(columns.kind):
        kind = columns.kinds[code]
        if kind.cat == kineto.CPU_OP:
            shapes, dtypes, _ = columns.input_lists[columns.inputs[row]]
            # a trace file writes a tensor list's sizes, one list per tensor, where the event gives []
            ops.append((kind.name, columns.sequence[row], list(dtypes),
                        None if "TensorList" in dtypes else freeze(shapes)))
    return ops, list(columns.memory_bytes)


def test_a_runs_trace_file_fills_the_columns_its_events_did(real):
    """A run's exported trace read into columns as any file is holds what its events gave the live reading, op by
    op (torch 2.13's export writes no "flops" argument, even with with_flops=True: not compared)."""
    events, _, path = real
    live = live_table(events, (), shapes=True, flops=True)
    file_ops, file_memory = _ops_and_memory(read_table(path)[0])
    live_ops, live_memory = _ops_and_memory(live)
    assert len(file_ops) > 10 and sorted(file_ops, key=repr) == sorted(live_ops, key=repr)
    assert file_memory == live_memory and file_memory


def test_the_enums_and_activity_types_the_stand_ins_use_are_torchs(real):
    assert kineto_fakes.DeviceType is DeviceType
    stand_ins = GPU_SCENARIO + [_memory_event()]
    assert {type(e.device_type()) for e in stand_ins} == {DeviceType}
    # every activity type a real CPU run gives, and every one the stand-ins give, is kineto's (kineto.py's names)
    known = lambda kind: kineto.is_read(kind) or kind in kineto.UNREAD_ON_PURPOSE  # noqa: E731
    real_kinds = {e.activity_type() for e in real[0]} if hasattr(_KinetoEvent, "activity_type") else set()
    assert all(map(known, real_kinds)), real_kinds
    ours = {e.activity_type() for e in stand_ins} | {activity.inferred_activity(e) for e in GPU_SCENARIO}
    assert all(map(known, ours)), ours
