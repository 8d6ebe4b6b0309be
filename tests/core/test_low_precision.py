"""Re-timing a trace's calls in 16 bits (core/measure/low_precision.py): the same aten op rebuilt from the
shapes and arguments the profiler recorded, on this CPU, leaving the user's random state alone."""

import torch

from torchmagic.core.devices import CpuDevice
from torchmagic.core.measure import low_precision
from torchmagic.core.measure.low_precision import OpCall, call_ratios, freeze, pointwise_ratio


def test_the_recorded_calls_are_rebuilt_and_timed_both_ways_without_touching_the_rng(monkeypatch):
    monkeypatch.setattr(low_precision, "_measured", {})
    calls = []
    with torch.profiler.profile(record_shapes=True) as prof:
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(512, 16))
        model(torch.randn(4, 3, 8, 8)).sum().backward()
    for e in prof.profiler.kineto_results.events():
        if e.name() in {"aten::addmm", "aten::mm", "aten::mkldnn_convolution", "aten::convolution_backward"}:
            calls.append(OpCall(e.name(), freeze(e.shapes()), freeze(e.dtypes()), freeze(e.concrete_inputs())))
    assert {c.name for c in calls} == {"aten::addmm", "aten::mm", "aten::mkldnn_convolution",
                                       "aten::convolution_backward"}
    state = torch.random.get_rng_state()
    retimed = call_ratios(CpuDevice(), calls, torch.bfloat16, budget_s=10.0)
    assert torch.equal(state, torch.random.get_rng_state())
    # every call rebuilt (addmm's keyword-only beta and alpha included), each time positive and finite
    assert set(retimed) == set(calls)
    assert all(0 < r.ratio < 1e4 and 0 < r.conversion < 1e4 for r in retimed.values())
    assert 0 < pointwise_ratio(CpuDevice(), torch.bfloat16, 1 << 16) < 1e3


def test_a_call_that_cannot_be_rebuilt_is_left_out(monkeypatch):
    monkeypatch.setattr(low_precision, "_measured", {})
    bogus = [OpCall("aten::no_such_op", ((4, 4),), ("float",), (None,)),
             OpCall("aten::mm", ((4, 4), (5, 5)), ("float", "float"), (None, None)),  # shapes that do not fit
             OpCall("aten::mm", ((), ()), ("Scalar", "Scalar"), (1, 2))]  # no tensor to convert
    good = OpCall("aten::mm", ((64, 64), (64, 64)), ("float", "float"), (None, None))
    retimed = call_ratios(CpuDevice(), [*bogus, good], torch.bfloat16, budget_s=10.0)
    assert list(retimed) == [good]


def test_autocasts_own_cost_is_timed_once_a_process_per_device_threads_and_dtype(monkeypatch):
    """Every %%torchprofile's amp estimate reads it: timed anew it was 40-60 ms of a small profile's analysis."""
    monkeypatch.setattr(low_precision, "_measured", {})
    timed = []
    real_time = low_precision._time
    monkeypatch.setattr(low_precision, "_time", lambda fn, device: timed.append(fn) or real_time(fn, device))
    first = low_precision.autocast_op_cost_us(CpuDevice(), torch.bfloat16)
    assert len(timed) == 2 and first >= 0.0  # with autocast and without
    assert low_precision.autocast_op_cost_us(CpuDevice(), torch.bfloat16) == first and len(timed) == 2
    low_precision.autocast_op_cost_us(CpuDevice(), torch.float16)
    assert len(timed) == 4  # another dtype is timed on its own
