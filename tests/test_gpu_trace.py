"""The CUDA paths of the trace analysis, on a hand-built GPU trace.

No GPU here, so kineto's events are replaced by objects with the same methods; the timings
form a small scenario whose every number is worked out by hand below.
"""

import pytest
from torch.autograd import DeviceType

from torchmagic.engines import rules, trace

T0 = 1_000_000_000


class Ev:
    def __init__(self, name, start_us, end_us, tid=1, corr=0, linked=0, seq=-1, kind="op",
                 device=DeviceType.CPU, stream=0, dtypes=()):
        self._name, self._start, self._end = name, start_us, end_us
        self._tid, self._corr, self._linked, self._seq = tid, corr, linked, seq
        self._kind, self._device, self._stream, self._dtypes = kind, device, stream, list(dtypes)

    def activity_type(self):
        if self._device != DeviceType.CPU:
            return "gpu_memcpy" if self._name.startswith("Memcpy") else "kernel"
        if self._name.startswith("cuda"):
            return "cuda_runtime"
        return {"op": "cpu_op", "annotation": "user_annotation", "python": "python_function"}[self._kind]

    def name(self): return self._name
    def start_ns(self): return T0 + int(self._start * 1000)
    def duration_ns(self): return int((self._end - self._start) * 1000)
    def device_type(self): return self._device
    def device_resource_id(self): return self._stream
    def device_index(self): return 0
    def linked_correlation_id(self): return self._linked
    def correlation_id(self): return self._corr
    def start_thread_id(self): return self._tid
    def is_async(self): return False
    def is_hidden_event(self): return False
    def is_python_function(self): return self._kind == "python"
    def is_user_annotation(self): return self._kind == "annotation"
    def sequence_nr(self): return self._seq
    def dtypes(self): return self._dtypes
    def flops(self): return 0
    def shapes(self): return []
    def nbytes(self): return 0


CUDA = DeviceType.CUDA
EVENTS = [
    # main thread: step 0 spans 0..1000 µs
    Ev("ProfilerStep#0", 0, 1000, kind="annotation"),
    Ev("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 10, 210, kind="annotation"),
    Ev("aten::linear", 220, 300, corr=10, seq=5),
    Ev("aten::addmm", 230, 290, corr=11, dtypes=["float", "float"]),
    Ev("cudaLaunchKernel", 240, 250, tid=99_001, linked=11),  # CUPTI's OS thread id
    Ev("aten::item", 300, 400, corr=12),
    Ev("aten::_local_scalar_dense", 305, 395, corr=13),
    Ev("cudaMemcpyAsync", 310, 390, tid=99_001, linked=13),
    Ev("torchmagic::wait_for_device", 900, 1000, kind="annotation"),
    Ev("cudaDeviceSynchronize", 905, 995, tid=99_001),  # outside any op: not linked
    # the autograd engine's device thread runs backward while the main thread waits
    Ev("autograd::engine::evaluate_function: AddmmBackward0", 420, 880, tid=2, corr=20, seq=5),
    Ev("aten::mm", 430, 870, tid=2, corr=21, dtypes=["float", "float"]),
    Ev("cudaLaunchKernel", 440, 450, tid=99_002, linked=21),
    # the GPU
    Ev("Memcpy HtoD (Pageable -> Device)", 100, 120, device=CUDA, stream=7),
    Ev("ampere_sgemm_128x64_tn", 250, 350, device=CUDA, stream=7, linked=11),
    Ev("Memcpy DtoH (Device -> Pageable)", 320, 330, device=CUDA, stream=7, linked=13),
    Ev("ampere_sgemm_128x64_nn", 450, 860, device=CUDA, stream=7, linked=21),
]


@pytest.fixture(scope="module")
def summary():
    return trace.summarize_trace(EVENTS, T0)


def test_step_and_categories_count_each_microsecond_once(summary):
    assert summary.step_us == [1000.0]
    c = summary.category_us
    assert c[trace.DATA] == pytest.approx(200)
    assert c[trace.FORWARD] == pytest.approx(80)  # linear 20 + addmm 50 + launch 10
    assert c[trace.SYNCS] == pytest.approx(100)   # item and what it waited for
    assert c[trace.BACKWARD] == pytest.approx(460)  # on the autograd thread
    assert c[trace.DEVICE_WAIT] == pytest.approx(100)
    # the main thread's 520 µs of gaps minus the 460 µs it waited for the backward thread
    assert c[trace.OTHER] == pytest.approx(60)
    assert sum(c.values()) == pytest.approx(1000)


def test_kernels_go_to_the_ops_that_launched_them(summary):
    assert summary.ops["aten::addmm"].self_device_us == pytest.approx(100)
    assert summary.ops["aten::_local_scalar_dense"].self_device_us == pytest.approx(10)
    assert summary.ops["aten::mm"].self_device_us == pytest.approx(410)
    assert summary.device_category_us[trace.BACKWARD] == pytest.approx(410)
    assert summary.device_category_us[trace.OTHER] == pytest.approx(20)  # the unlinked copy
    assert summary.matmul_fp32_device_us == pytest.approx(510)


def test_device_busy_exposed_loading_and_copies(summary):
    assert summary.device_busy_us == pytest.approx(530)
    assert summary.data_exposed_us == pytest.approx(180)  # 200 minus the 20 the GPU was copying
    assert summary.pageable_h2d == 1
    assert summary.sync_calls == 1
    assert summary.sync_runtime_calls == 0  # torchmagic's own end-of-step wait is not the user's sync


def test_timeline_has_cpu_threads_and_gpu_stream(summary):
    lanes = {span.lane for span in summary.timeline}
    assert lanes == {"CPU main thread", "CPU thread 2", "GPU stream 7"}


def test_rules_on_the_gpu_trace(summary):
    ctx = rules.RuleContext("cuda", True, "bfloat16", "sm90")
    found = {f.rule: f for f in rules.diagnose(summary, ctx)}
    assert found["gpu_idle"].evidence["idle_ms_per_step"] == pytest.approx(0.47)
    assert set(found["gpu_idle"].evidence["causes"]) == {"dataloader", "sync", "copies"}
    assert found["dataloader"].evidence["exposed_ms_per_step"] == pytest.approx(0.18)
    assert found["amp"].evidence["fp32_matmul_share"] == pytest.approx(510 / 540, abs=1e-3)
    assert "1 host-device syncs per step" in found["sync"].title
    assert found["copies"].evidence["pageable_h2d_per_step"] == 1


def test_explicit_synchronize_is_a_sync():
    events = [Ev("ProfilerStep#0", 0, 100, kind="annotation"),
              Ev("cudaDeviceSynchronize", 10, 60, tid=5)]
    s = trace.summarize_trace(events, T0)
    assert s.sync_runtime_calls == 1 and s.category_us[trace.SYNCS] == pytest.approx(50)
