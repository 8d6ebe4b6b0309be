"""Activity types on torch builds without ``_KinetoEvent.activity_type()`` (2.4 to 2.12)."""

import pytest
import torch
from torch._C._autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from torchmagic.features.profile import activity, live_table
from torchmagic.features.profile.live_table import summarize_live

from .kineto_fakes import Torch211Event, summarized

needs_activity_type = pytest.mark.skipif(not hasattr(torch._C._autograd._KinetoEvent, "activity_type"),
                                         reason="this torch cannot tell the true activity type")


def _profiled_training():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, profile_memory=True,
                 record_shapes=True) as prof:
        for i in range(2):
            with record_function(f"ProfilerStep#{i}"):
                opt.zero_grad()
                model(torch.randn(16, 64)).square().mean().backward()
                opt.step()
    return prof.profiler.kineto_results


@needs_activity_type
def test_inferred_activity_agrees_with_torch_on_every_event_of_a_cpu_trace():
    events = [e for e in _profiled_training().events() if _readable(e)]
    kinds = {e.activity_type() for e in events}
    assert {"cpu_op", "user_annotation", "python_function", "cpu_instant_event"} <= kinds
    wrong = [(e.name(), e.activity_type(), activity.inferred_activity(e)) for e in events
             if activity.inferred_activity(e) != e.activity_type()]
    assert not wrong, wrong[:10]


def _readable(e):
    try:
        return bool(e.name())
    except UnicodeDecodeError:  # torch 2.13's Python tracer garbles a name now and then (see events.py)
        return False


@needs_activity_type
def test_a_summary_is_the_same_whichever_way_activities_are_read(monkeypatch):
    results = _profiled_training()
    exact = summarize_live(results, shapes=True)[0]
    monkeypatch.setattr(live_table, "activity_reader", lambda sample: activity.inferred_activity)
    inferred = summarize_live(results, shapes=True)[0]
    assert inferred.steps == exact.steps == 2
    assert inferred.category_us == exact.category_us
    assert {n: (o.calls, o.self_cpu_us) for n, o in inferred.ops.items()} == \
        {n: (o.calls, o.self_cpu_us) for n, o in exact.ops.items()}


@pytest.mark.parametrize("event, expected", [
    (Torch211Event("void at::native::vectorized_elementwise_kernel<4>(...)"), "kernel"),
    (Torch211Event("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32"), "kernel"),
    (Torch211Event("Memcpy HtoD (Pageable -> Device)"), "gpu_memcpy"),
    (Torch211Event("Memset (Device)"), "gpu_memset"),
    (Torch211Event("Stream Sync"), "cuda_sync"),
    (Torch211Event("ProfilerStep#3", annotation=True), "gpu_user_annotation"),
    (Torch211Event("[memory]"), "cpu_instant_event"),
    (Torch211Event("cudaLaunchKernel", DeviceType.CPU), "cuda_runtime"),
    (Torch211Event("cuLaunchKernelEx", DeviceType.CPU), "cuda_runtime"),
    (Torch211Event("hipMemcpyAsync", DeviceType.CPU), "hip_runtime"),
    (Torch211Event("cudaDeviceSynchronize", DeviceType.CPU), "cuda_runtime"),
    # called where no op encloses them: torch.cuda.synchronize(), a CUDA graph's replay
    (Torch211Event("cudaDeviceSynchronize", DeviceType.CPU, linked=0), "cuda_runtime"),
    (Torch211Event("cudaGraphLaunch", DeviceType.CPU, linked=0), "cuda_runtime"),
    (Torch211Event("cuda_block", DeviceType.CPU, linked=0), "cpu_op"),
    (Torch211Event("aten::cudnn_convolution", DeviceType.CPU, linked=0), "cpu_op"),
    (Torch211Event("custom_block", DeviceType.CPU, linked=0), "cpu_op"),
    (Torch211Event("Activity Buffer Request", DeviceType.CPU, linked=0), "overhead"),
])
def test_device_and_runtime_events_are_told_apart_by_device_and_name(event, expected):
    assert activity.inferred_activity(event) == expected


@needs_activity_type
def test_python_calls_from_the_event_tree_give_the_same_hot_lines(monkeypatch):
    """torch before is_python_function() keeps the Python tracer's calls out of events(); read from
    the event tree instead, they rank the user's functions as the events do on torch 2.13."""
    def heavy():
        a = torch.randn(128, 128)
        return a @ a @ a

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for i in range(2):
            with record_function(f"ProfilerStep#{i}"):
                heavy()
    results = prof.profiler.kineto_results
    events = [e for e in results.events() if _readable(e)]
    exact = summarized(events)
    monkeypatch.setattr(activity, "_KinetoEvent", type("OldKinetoEvent", (), {}))  # torch 2.11's
    calls = activity.python_calls(results)
    assert any(name.endswith(": heavy") for name, *_ in calls)
    without_python = [e for e in events if e.activity_type() != "python_function"]
    rebuilt = summarized(without_python, python_calls=calls)
    assert exact.hot_lines and rebuilt.hot_lines.most_common(1)[0][0] == exact.hot_lines.most_common(1)[0][0]
    assert {n: o.calls for n, o in rebuilt.ops.items()} == {n: o.calls for n, o in exact.ops.items()}
