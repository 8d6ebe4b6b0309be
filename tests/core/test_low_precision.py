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


def test_mkldnns_convolution_is_retimed_through_aten_convolution_with_its_arguments_in_their_places():
    """mkldnn refuses bf16 without AVX512 (the AVX2 EPYC: "bf16 path needs the cpu support avx_ne_convert or
    avx512bw..."), so the call goes through aten::convolution, which picks what autocast's conv2d would: the same
    convolution, its padding, stride and dilation not swapped."""
    generator = torch.Generator().manual_seed(0)
    data, weight, bias = torch.randn(2, 4, 9, 11, generator=generator), torch.randn(6, 2, 3, 2, generator=generator), \
        torch.randn(6, generator=generator)
    for padding, stride, dilation in [([1, 0], [2, 1], [1, 2]), ([0, 2], [1, 3], [2, 1])]:
        recorded = [data, weight, bias, padding, stride, dilation, 2]
        mapped, tensors = low_precision._THROUGH_CONVOLUTION["aten::mkldnn_convolution"](recorded, [0, 1, 2])
        assert tensors == [0, 1, 2]
        assert torch.allclose(torch.ops.aten.convolution(*mapped), torch.ops.aten.mkldnn_convolution(*recorded),
                              atol=1e-5)
    call = OpCall("aten::mkldnn_convolution", ((2, 4, 9, 9), (6, 2, 3, 3), (6,), (), (), (), ()),
                  ("float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar"),
                  (None, None, None, (1, 0), (2, 1), (1, 2), 2))
    fp32, low, _ = low_precision._rebuild(call, CpuDevice(), torch.bfloat16, generator)
    assert fp32().dtype == torch.float32 and low().dtype == torch.bfloat16  # on any CPU
