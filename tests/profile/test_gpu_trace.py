"""The CUDA paths of the trace analysis, on a hand-built GPU trace.

No GPU here, so kineto's events are replaced by objects with the same methods; the timings
form a small scenario whose every number is worked out by hand below.
"""

import pytest
from torch.autograd import DeviceType

from torchmagic.features.profile import categories, rules
from torchmagic.features.profile.summary import TraceSummary

from .contexts import cpu_context, cuda_context
from .kineto_fakes import Ev, summarized

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
    return summarized(EVENTS)


def test_step_and_categories_count_each_microsecond_once(summary):
    assert summary.step_us == [1000.0]
    c = summary.category_us
    assert c[categories.DATA] == pytest.approx(200)
    assert c[categories.FORWARD] == pytest.approx(80)  # linear 20 + addmm 50 + launch 10
    assert c[categories.SYNCS] == pytest.approx(100)   # item and what it waited for
    assert c[categories.BACKWARD] == pytest.approx(460)  # on the autograd thread
    assert c[categories.DEVICE_WAIT] == pytest.approx(100)
    # the main thread's 520 µs of gaps minus the 460 µs it waited for the backward thread
    assert c[categories.OTHER] == pytest.approx(60)
    assert sum(c.values()) == pytest.approx(1000)


def test_kernels_go_to_the_ops_that_launched_them(summary):
    assert summary.ops["aten::addmm"].self_device_us == pytest.approx(100)
    assert summary.ops["aten::_local_scalar_dense"].self_device_us == pytest.approx(10)
    assert summary.ops["aten::mm"].self_device_us == pytest.approx(410)
    assert summary.device_category_us[categories.BACKWARD] == pytest.approx(410)
    assert summary.device_category_us[categories.OTHER] == pytest.approx(20)  # the unlinked copy
    assert summary.matmul_fp32_device_us == pytest.approx(510)


def test_device_busy_exposed_loading_and_copies(summary):
    assert summary.device_busy_us == pytest.approx(530)
    assert summary.data_exposed_us == pytest.approx(180)  # 200 minus the 20 the GPU was copying
    assert summary.pageable_h2d == 1 and summary.pageable_h2d_us == pytest.approx(20)
    assert summary.sync_calls == 1
    assert summary.sync_runtime_calls == 0  # torchmagic's own end-of-step wait is not the user's sync


def test_timeline_has_cpu_threads_and_gpu_stream(summary):
    lanes = {span.lane for span in summary.timeline}
    assert lanes == {"CPU main thread", "CPU thread 2", "GPU stream 7"}


def test_rules_on_the_gpu_trace(summary):
    ctx = cuda_context()
    found = {f.rule: f for f in rules.diagnose(summary, ctx)}
    assert found["gpu_idle"].evidence["idle_ms_per_step"] == pytest.approx(0.47)
    assert set(found["gpu_idle"].evidence["causes"]) == {"dataloader", "sync"}
    assert found["dataloader"].evidence["exposed_ms_per_step"] == pytest.approx(0.18)
    assert found["amp"].evidence["fp32_matmul_share"] == pytest.approx(510 / 540, abs=1e-3)
    assert "1 host-device syncs per step" in found["sync"].title
    # one pageable copy of 20 µs in a 1 ms step (2%): below the rule's threshold, so no finding
    assert "copies" not in found


def test_explicit_synchronize_is_a_sync():
    events = [Ev("ProfilerStep#0", 0, 100, kind="annotation"),
              Ev("cudaDeviceSynchronize", 10, 60, tid=5)]
    s = summarized(events)
    assert s.sync_runtime_calls == 1 and s.category_us[categories.SYNCS] == pytest.approx(50)


def launched(op, start, host_us, kernel_start, kernel_us, corr, cupti, dtypes=(), tid=1, kernel=None):
    """An op whose 5 µs launch (on CUPTI's OS thread) puts one kernel on stream 7."""
    return [Ev(op, start, start + host_us, tid=tid, corr=corr, dtypes=dtypes),
            Ev("cudaLaunchKernel", start + 1, start + 6, tid=99_001, corr=cupti, linked=corr),
            Ev(kernel or f"{op}_kernel", kernel_start, kernel_start + kernel_us, device=CUDA, stream=7,
               corr=cupti, linked=corr)]


def step(*events, end=1000):
    return [Ev("ProfilerStep#0", 0, end, kind="annotation"), *events]


# --- amp judges GPU work by kernel time ---------------------------------------------------------

def test_amp_fires_on_long_fp32_kernels_whose_host_time_is_only_the_launch():
    # three aten::mm of 10 µs on the host (5 of them launching) and 250 µs on the GPU each:
    # by host self time each call is 5 µs, "tiny"; by kernel time it is 250 µs, and all the GPU's work
    events = step(*(e for i in range(3) for e in
                    launched("aten::mm", 100 * i, 10, 100 + 250 * i, 250, corr=10 + i, cupti=500 + i,
                             dtypes=["float", "float"])))
    s = summarized(events)
    assert s.matmul_fp32_us / s.matmul_fp32_calls == pytest.approx(5)
    assert s.matmul_fp32_device_calls == 3 and s.matmul_fp32_device_us == pytest.approx(750)
    f = rules.amp(s, cuda_context())
    assert f is not None and f.title.startswith("100% of the GPU kernel time is fp32 matmul/conv")
    assert f.evidence["fp32_matmul_us_per_call"] == pytest.approx(250)


def test_amp_silent_on_tiny_fp32_kernels_even_when_their_host_time_is_long():
    # 50 matmuls whose dispatch takes 30 µs each but whose kernels take 3 µs: autocast's casts cost more
    events = step(*(e for i in range(50) for e in
                    launched("aten::mm", 10 + 32 * i, 30, 20 + 32 * i, 3, corr=10 + i, cupti=500 + i,
                             dtypes=["float", "float"])), end=2000)
    s = summarized(events)
    assert s.matmul_fp32_us / s.matmul_fp32_calls > rules.THRESHOLDS["amp_min_matmul_us"]
    assert rules.amp(s, cuda_context()) is None


def _training_matmul_trace():
    return step(*launched("aten::mm", 100, 10, 100, 500, corr=10, cupti=500, dtypes=["float", "float"]),
                Ev("autograd::engine::evaluate_function: MmBackward0", 200, 300, corr=20),
                *launched("aten::mm", 210, 10, 600, 300, corr=21, cupti=501, dtypes=["float", "float"]))


def test_amp_fix_on_cuda_is_bf16_autocast_on_ampere_and_fp16_with_grad_scaler_before():
    s = summarized(_training_matmul_trace())
    bf16 = rules.amp(s, cuda_context((9, 0)))
    assert "torch.autocast('cuda', dtype=torch.bfloat16)" in bf16.snippet and "GradScaler" not in bf16.snippet
    assert "no loss scaling" in bf16.fix
    fp16 = rules.amp(s, cuda_context((7, 5)))
    assert "torch.autocast('cuda', dtype=torch.float16)" in fp16.snippet
    assert "torch.amp.GradScaler('cuda')" in fp16.snippet and "scaler.scale(loss).backward()" in fp16.snippet
    assert "GradScaler" in fp16.fix and "Ampere" in fp16.fix


# --- the profiled steps' own memory peak --------------------------------------------------------

def _memory_trace():
    # forward's activations on the main thread, gradients on the autograd thread while they live:
    # 600 + 300 held at once, which a thread-by-thread count (600, then 300) misses
    return step(Ev("[memory]", 100, 100, kind="memory", device=CUDA, nbytes=600),
                Ev("[memory]", 200, 200, tid=2, kind="memory", device=CUDA, nbytes=300),
                Ev("[memory]", 300, 300, kind="memory", device=CUDA, nbytes=-600),
                Ev("[memory]", 400, 400, tid=2, kind="memory", device=CUDA, nbytes=-250))


def test_memory_peak_is_counted_in_time_order_across_threads():
    s = summarized(_memory_trace())
    assert s.peak_allocated["cuda:0"] == 900
    assert s.allocated_net["cuda:0"] == 50  # 50 bytes of gradients outlive the step


def _cuda_ctx(**counters):
    return cuda_context(allocator=rules.AllocatorCounters(**counters))


def test_step_peak_from_memory_events_is_exact_whatever_the_user_s_peak_counter_says():
    s = summarized(_memory_trace())
    # 80 held before the profile (130 after it, less its net 50), 900 above that at the peak;
    # the user's high-water mark (990, from earlier work) says nothing about this step
    ctx = _cuda_ctx(total=1000, allocated_before=80, allocated_after=130, peak_before=990, peak_after=990)
    assert rules.step_peak(s, ctx) == (980, 980)
    f = rules.batch_size(s, ctx)
    assert f.title == "Memory pressure: the step's peak reaches 98% of the GPU's memory"


def test_step_peak_from_the_allocator_s_counters_is_exact_only_when_the_step_set_a_new_mark():
    s = TraceSummary(step_us=[1000.0])
    new_mark = _cuda_ctx(total=1000, allocated_before=100, allocated_after=100, peak_before=400, peak_after=950)
    assert rules.step_peak(s, new_mark) == (950, 950)
    old_mark = _cuda_ctx(total=1000, allocated_before=100, allocated_after=120, peak_before=990, peak_after=990)
    assert rules.step_peak(s, old_mark) == (120, 990)
    # neither pressure (at least 12%) nor a small batch (at most 99%) can be claimed, however idle the GPU
    idle = TraceSummary(step_us=[1000.0], has_device_events=True, device_busy_us=100.0)
    assert rules.batch_size(idle, old_mark) is None


def test_small_batch_needs_the_peak_s_upper_bound_low():
    idle = TraceSummary(step_us=[1000.0], has_device_events=True, device_busy_us=100.0)
    bounded = _cuda_ctx(total=1000, allocated_before=50, allocated_after=60, peak_before=200, peak_after=200)
    f = rules.batch_size(idle, bounded)
    assert f.title == "Small batch: the GPU idles 90% of the step with at most 20% of its memory in use"
    assert f.evidence["peak_fraction"] == pytest.approx(0.06) and f.evidence["peak_fraction_at_most"] == 0.2


# --- a CUDA profile without kernels says so ------------------------------------------------------

def test_a_cuda_profile_whose_ops_launched_no_kernels_says_cupti_recorded_none():
    # what a trace looks like when CUPTI is unavailable: torch's ops, no runtime calls, no kernels
    events = step(Ev("aten::view", 10, 20), Ev("aten::linear", 100, 300, corr=1, seq=3),
                  Ev("aten::addmm", 110, 290, corr=2, dtypes=["float", "float"]), Ev("aten::relu", 400, 450, corr=3))
    s = summarized(events)
    assert s.launching_ops == 2  # linear and relu; view launches nothing, addmm is inside linear
    ctx = cuda_context()
    note = rules.missing_kernels_note(s, ctx)
    assert note.startswith("No GPU kernels in this profile of a CUDA device, though its steps ran 2 ops: "
                           "CUPTI recorded none")
    assert {f.rule for f in rules.diagnose(s, ctx)}.isdisjoint({"amp", "gpu_idle"})
    assert rules.missing_kernels_note(s, cpu_context()) is None
    views_only = summarized(step(Ev("aten::view", 10, 20), Ev("aten::detach", 30, 40)))
    assert rules.missing_kernels_note(views_only, ctx) is None


def test_no_note_when_the_kernels_are_there(summary):
    assert rules.missing_kernels_note(summary, cuda_context()) is None


# --- kernels under user ranges and compiled graphs ----------------------------------------------

COMPILED = step(
    # a torch.compile'd forward: the region and CompiledFunction are ops (torch 2.13 names), the
    # graph call a user range; inductor wraps each Triton launch in an op named after the kernel
    Ev("Torch-Compiled Region: 0/0", 10, 200, corr=30),
    Ev("CompiledFunction", 20, 190, corr=31),
    Ev("## Call CompiledFxGraph fl2qpp5q ##", 30, 180, kind="annotation"),
    *launched("aten::mm", 40, 20, 50, 200, corr=32, cupti=1001, dtypes=["float", "float"]),
    Ev("triton_poi_fused_relu_0", 70, 90, corr=33),
    Ev("cuLaunchKernel", 75, 85, tid=99_001, corr=1002, linked=33),
    Ev("triton_poi_fused_relu_0", 250, 270, device=CUDA, stream=7, corr=1002, linked=33),
    # a custom extension's kernel under record_function("my_block"): no op around its launch
    Ev("my_block", 300, 400, kind="annotation"),
    Ev("cudaLaunchKernel", 310, 320, tid=99_001, corr=1003),
    Ev("my_ext_kernel", 320, 420, device=CUDA, stream=7, corr=1003),
    # the compiled backward
    Ev("autograd::engine::evaluate_function: CompiledFunctionBackward", 450, 600, corr=40),
    Ev("CompiledFunctionBackward", 455, 595, corr=41),
    Ev("triton_per_fused_sum_1", 460, 480, corr=42),
    Ev("cuLaunchKernel", 465, 475, tid=99_001, corr=1004, linked=42),
    Ev("triton_per_fused_sum_1", 480, 530, device=CUDA, stream=7, corr=1004, linked=42),
    # a hand-written Triton optimizer kernel, launched straight from Python inside the optimizer step
    Ev("Optimizer.step#AdamW.step", 620, 800, kind="annotation"),
    Ev("cuLaunchKernel", 630, 640, tid=99_001, corr=1005),
    Ev("adamw_triton_kernel", 640, 700, device=CUDA, stream=7, corr=1005),
    Ev("torchmagic::wait_for_device", 900, 1000, kind="annotation"),
    Ev("cudaDeviceSynchronize", 905, 995, tid=99_001, corr=1006),
)


def test_kernels_go_to_their_compiled_graph_or_user_range_in_its_phase():
    s = summarized(COMPILED)
    device_us = {name: op.self_device_us for name, op in s.ops.items() if op.self_device_us}
    assert device_us == pytest.approx({"aten::mm": 200, "triton_poi_fused_relu_0": 20, "my_block": 100,
                                       "triton_per_fused_sum_1": 50, "Optimizer.step#AdamW.step": 60})
    c = s.device_category_us
    assert c[categories.FORWARD] == pytest.approx(320)
    assert c[categories.BACKWARD] == pytest.approx(50)
    assert c[categories.OPTIMIZER] == pytest.approx(60)
    assert c[categories.OTHER] == 0
    assert {span.category for span in s.timeline if span.lane == "GPU stream 7"} == {
        categories.FORWARD, categories.BACKWARD, categories.OPTIMIZER}


def test_one_time_costs_are_start_up_and_out_of_the_steady_state():
    """A step that creates the CUDA context, loads a kernel at its first launch and compiles a graph:
    each is named, shown as start-up, and the rules judge shares of what is left (as torch 2.13 records
    torch.compile's first call: 'dynamo' around its nested dynamo_timed ranges)."""
    from torchmagic.features.profile.kineto import CUDA_CONTEXT, FIRST_COMPILE, LAZY_LOADING

    events = [
        Ev("ProfilerStep#0", 0, 100_000, kind="annotation"),
        Ev("aten::to", 0, 30_000, corr=1),
        Ev("cudaDeviceGetStreamPriorityRange", 10, 29_000, tid=99_001, linked=1),   # the context: 29 ms
        Ev("dynamo", 30_000, 70_000),
        Ev("_compile.compile_inner (dynamo_timed)", 30_100, 69_900),
        Ev("aten::randn", 31_000, 32_000, corr=2),                                   # inductor's own work
        Ev("aten::mm", 70_000, 90_000, corr=3, seq=1),
        # CUPTI's id (50) joins the launch and its kernel; the first launch of that kernel: 15 ms
        Ev("cudaLaunchKernel", 70_010, 85_010, tid=99_001, corr=50, linked=3),
        Ev("ampere_sgemm_128x64_tn", 85_020, 89_000, device=CUDA, stream=7, corr=50, linked=3),
    ]
    s = summarized(events)
    assert s.one_time_us[CUDA_CONTEXT] == pytest.approx(28_990)
    assert s.one_time_us[FIRST_COMPILE] == pytest.approx(40_000)  # the compile's whole subtree
    assert s.one_time_us[LAZY_LOADING] == pytest.approx(15_000)
    assert s.category_us[categories.START_UP] == pytest.approx(28_990 + 40_000 + 15_000)
    assert s.steady_step_us == pytest.approx(100_000 - 83_990)
    assert s.python_ops == 2  # aten::to and aten::mm: the compiler's own ops are not the user's
