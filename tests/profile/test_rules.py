"""Each diagnosis rule, on a real CPU profile that triggers it and one that does not."""

import dataclasses
import json

import pytest
import torch

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.core.expectations import MOST_REMOVED
from torchmagic.features.profile import rules
from torchmagic.features.profile.result import Finding, Severity
from torchmagic.core.measure.low_precision import Retimed
from torchmagic.features.profile.options import ProfileOptions
from torchmagic.features.profile.summary import TraceSummary
from torchmagic.features.profile.user import UserSetup

from .. import workloads as w
from ..fakes import FastBf16Cpu
from .contexts import cpu_context, cuda_context


def profile(step, device=None, **kw):
    kw.setdefault("warmup", 1)
    kw.setdefault("steps", 2)
    return torchmagic.profile(step, device=device or CpuDevice(), **kw)


def rules_of(result):
    return {f.rule for f in result.findings}


def test_dataloader_fires_on_slow_per_item_transform():
    r = profile(w.slow_loader_step())
    f = r.finding("dataloader")
    assert f is not None
    assert f.evidence["share_of_step"] > rules.THRESHOLDS["dataloader_share"]
    assert "num_workers" in f.snippet
    assert "torch.set_num_threads" in f.fix  # on CPU, workers compete with torch's threads
    assert r.categories_s["data loading"] == max(r.categories_s.values())


def test_dataloader_silent_when_batches_are_ready():
    assert "dataloader" not in rules_of(profile(w.fast_data_step()))


def test_sync_fires_on_item_every_batch():
    f = profile(w.item_per_batch_step()).finding("sync")
    assert f is not None
    assert f.evidence["syncs_per_step"] == pytest.approx(20, abs=1)
    assert f.severity == "low"  # cheap on CPU; the finding says so
    assert "free on CPU" in f.title


def test_sync_silent_when_loss_stays_on_device():
    step = w.train_step_fn(w.mlp(), [(torch.randn(8, 32), torch.randn(8, 1)) for _ in range(20)])
    assert "sync" not in rules_of(profile(step))


def test_dispatch_bound_fires_on_many_tiny_ops():
    f = profile(w.tiny_ops_step()).finding("dispatch_bound")
    assert f is not None
    assert f.evidence["ops_per_step"] >= 900  # 60 * 8 * 3 ops
    assert f.evidence["median_op_us"] <= rules.THRESHOLDS["dispatch_median_op_us"]
    assert "torch.compile" in f.snippet


def test_dispatch_bound_silent_on_large_matmuls():
    assert "dispatch_bound" not in rules_of(profile(w.big_matmul_inference_step()))


@pytest.fixture
def bf16_measured(monkeypatch):
    """Re-timed matmuls measure ``ratio`` (bf16 time over fp32) and pointwise ops ``pointwise``, whatever
    the CPU under the test: CI's may have no bf16 instructions at all."""
    from torchmagic.features.profile import amp_estimate

    def declare(ratio, pointwise=1.0, conversion=0.0):
        monkeypatch.setattr(amp_estimate, "call_ratios",
                            lambda device, calls, dtype, budget: {c: Retimed(ratio, conversion) for c in calls})
        monkeypatch.setattr(amp_estimate, "pointwise_ratio", lambda device, dtype, numel: pointwise)
        monkeypatch.setattr(amp_estimate, "autocast_op_cost_us", lambda device, dtype: 0.0)
    return declare


def test_amp_fires_on_fp32_matmuls_where_bf16_measures_faster_and_predicts_the_step(bf16_measured):
    bf16_measured(0.4)
    r = profile(w.big_matmul_inference_step(), device=FastBf16Cpu(fast=True))
    f = r.finding("amp")
    assert f is not None
    share = f.evidence["fp32_matmul_share"]
    assert share >= rules.THRESHOLDS["amp_fp32_matmul_share"]
    assert "torch.autocast('cpu', dtype=torch.bfloat16)" in f.snippet
    # the matmuls' share at 0.4x their time, the rest unchanged (pointwise measured 1.0): one figure
    assert f.expected is not None and f.expected.low == f.expected.high
    assert f.expected.low == pytest.approx(1 / (1 - 0.6 * share), abs=0.02)
    assert f.verify == f"%%amp_compare --variants eager,amp --expect {f.expected.low:.2f}-{f.expected.high:.2f}"
    assert "predicted" in f.title and "re-timed here" in f.expected.basis
    assert f"predicted: the step {f.expected.text()} faster" in r.to_text()


def test_amp_is_not_raised_where_bf16_measures_slower_or_a_verify_measured_it_slower(bf16_measured):
    from torchmagic.core import expectations
    bf16_measured(3.0)  # an AVX512 CPU without native bf16: converted, emulated
    assert "amp" not in rules_of(profile(w.big_matmul_inference_step(), device=FastBf16Cpu(fast=True)))
    bf16_measured(0.4)
    code = "x = 1"
    expectations.remember("amp", expectations.code_key(code), expectations.Measured(0.9, (0.85, 0.95)))
    try:
        r = torchmagic.api._profile(w.big_matmul_inference_step(), ProfileOptions(steps=2, warmup=1), "t",
                                    FastBf16Cpu(fast=True), code=code)
        assert "amp" not in rules_of(r)  # what %%amp_compare measured on this code stands over the prediction
        expectations.remember("amp", expectations.code_key(code), expectations.Measured(1.4, (1.3, 1.5)))
        f = torchmagic.api._profile(w.big_matmul_inference_step(), ProfileOptions(steps=2, warmup=1), "t",
                                    FastBf16Cpu(fast=True), code=code).finding("amp")
        assert f.expected.low == 1.3 and "%%amp_compare measured autocast 1.40x on this code" in f.title
    finally:
        expectations._MEASURED.clear()


def test_amp_snippet_fits_inference_or_training(bf16_measured):
    bf16_measured(0.4)
    inference = profile(w.big_matmul_inference_step(), device=FastBf16Cpu(fast=True)).finding("amp")
    assert "inference_mode" in inference.snippet and "loss" not in inference.snippet
    training = profile(w.fast_data_step(), device=FastBf16Cpu(fast=True)).finding("amp")
    assert training is not None and "loss = loss_fn(model(x), y)" in training.snippet


def test_amp_silent_under_autocast():
    r = profile(w.big_matmul_inference_step(autocast=True), device=FastBf16Cpu(fast=True))
    assert "amp" not in rules_of(r)


def test_amp_silent_on_tiny_matmuls():
    # An RNN-like loop of 8x32 @ 32x32 matmuls: most of the step, but each call is a few µs,
    # where autocast's casts cost more than bf16 saves
    a, w_ = torch.randn(8, 32), torch.randn(32, 32)

    def step():
        h = a
        for _ in range(200):
            h = h @ w_
        return h

    r = profile(step, device=FastBf16Cpu(fast=True))
    assert "amp" not in rules_of(r)


def test_amp_silent_without_fast_low_precision():
    r = profile(w.big_matmul_inference_step(), device=FastBf16Cpu(fast=False))
    assert "amp" not in rules_of(r)


def test_copies_fires_on_conversions():
    f = profile(w.copy_heavy_step()).finding("copies")
    assert f is not None
    assert f.evidence["share_of_step"] >= rules.THRESHOLDS["copies_share"]
    assert f.evidence["contiguous_calls"] == 40  # 20 per step, 2 steps


def test_copies_silent_on_compute():
    assert "copies" not in rules_of(profile(w.big_matmul_inference_step()))


def test_inference_grad_fires_when_forward_builds_unused_graph():
    f = profile(w.grad_inference_step()).finding("inference_grad")
    assert f is not None
    assert "inference_mode" in f.snippet


def test_inference_grad_silent_under_inference_mode():
    assert "inference_grad" not in rules_of(profile(w.grad_inference_step(inference_mode=True)))


def test_inference_grad_silent_when_training():
    assert "inference_grad" not in rules_of(profile(w.fast_data_step()))


def test_inference_grad_silent_on_the_nodes_a_training_step_leaves_unused(monkeypatch):
    """torch's LSTM trained: its final hidden and cell states are graph nodes no backward uses (2 a step, beside
    4 used), made by ops that take none of the step: no evaluation pass to run without autograd."""
    torch.manual_seed(0)
    model = torch.nn.LSTM(32, 64, num_layers=2, batch_first=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 20, 32)

    def step():
        out, _ = model(x)
        out.sum().backward()
        opt.step()
        opt.zero_grad()

    assert "inference_grad" not in rules_of(profile(step))
    monkeypatch.setitem(rules.THRESHOLDS, "inference_grad_eval_share", 0.0)  # the case is held: else it fires
    assert profile(step).finding("inference_grad").evidence["unused_ms_per_step"] < 0.01


def test_optimizer_fires_on_per_parameter_loop():
    f = profile(w.many_params_step(foreach=False)).finding("optimizer")
    assert f is not None
    assert f.evidence["share_of_step"] >= rules.THRESHOLDS["optimizer_share"]
    assert "group['fused'] = True" in f.snippet and "group['foreach'] = False" in f.snippet  # on the CPU


def test_optimizer_on_the_cpu_asks_for_fused_even_with_foreach_and_is_silent_once_fused():
    # on the CPU foreach ops still loop over the tensors: only the fused kernel is one pass
    f = profile(w.many_params_step(foreach=True)).finding("optimizer")
    assert f is not None and "group['fused'] = True" in f.snippet and "still loops over the tensors" in f.fix
    assert "optimizer" not in rules_of(profile(w.many_params_step(foreach=False, fused=True)))


def test_optimizer_on_a_gpu_takes_foreach_as_the_fix():
    s = TraceSummary(step_us=[10_000.0], optimizer_us=3_000.0, optimizer_ops=40, optimizer_names={"AdamW"})
    f = rules.optimizer(s, cuda_context())
    assert "group['foreach'] = True" in f.snippet
    assert rules.optimizer(dataclasses.replace(s, optimizer_foreach=True), cuda_context()) is None


# gpu_idle needs device events, which only a real GPU produces: the rule is checked on
# summaries built from numbers here, and on a real trace by the gpu-marked test.
def _ctx(kind="cuda"):
    return cuda_context() if kind == "cuda" else cpu_context()


def _gpu_summary(busy_us):
    s = TraceSummary(step_us=[10_000.0, 10_000.0], has_device_events=True, device_busy_us=busy_us,
                     device_kernels=100, data_us=8_000.0)
    return s


def test_gpu_idle_fires_and_names_the_causes_found():
    findings = rules.diagnose(_gpu_summary(busy_us=5_000.0), _ctx())
    idle = next(f for f in findings if f.rule == "gpu_idle")
    assert idle.evidence["idle_ms_per_step"] == pytest.approx(7.5)
    assert idle.evidence["causes"] == ["dataloader"]
    assert idle.severity == "high"


def test_gpu_idle_silent_when_busy_or_on_cpu():
    assert rules.gpu_idle(_gpu_summary(busy_us=19_000.0), _ctx()) is None
    assert rules.gpu_idle(_gpu_summary(busy_us=0.0), _ctx("cpu")) is None


def test_every_threshold_is_used_by_some_rule():
    from pathlib import Path

    source = "".join(p.read_text() for p in Path(rules.__file__).parent.glob("*.py"))
    for key in rules.THRESHOLDS:
        assert source.count(f'"{key}"') >= 2, key


def test_severity_is_a_type_that_reads_as_its_value():
    # JSON, the text report's [high] and the HTML's CSS class show the value, on every Python (3.12 formats
    # a mixed-in enum as str() does)
    assert [rules.severity(share) for share in (0.3, 0.25, 0.1, 0.01)] == [
        Severity.HIGH, Severity.HIGH, Severity.MEDIUM, Severity.LOW]
    for member in Severity:
        assert str(member) == f"{member}" == format(member) == member.value
        assert f"[{member}] {member:>8}" == f"[{member.value}] {member.value:>8}"
        assert json.dumps({"severity": member}) == f'{{"severity": "{member.value}"}}' and member == member.value
    assert sorted(Severity, key=lambda member: -member.rank) == [Severity.LOW, Severity.MEDIUM, Severity.HIGH]


def test_findings_sorted_by_severity_then_share():
    s = TraceSummary(step_us=[1000.0], data_us=600.0, copy_us=150.0, sync_calls=5)
    order = [f.rule for f in rules.diagnose(s, _ctx("cpu"))]
    assert order[0] == "dataloader" and order.index("copies") < order.index("sync")


def test_every_verifiable_rule_names_a_command_and_fills_the_notebooks_names():
    ctx = cpu_context(user=UserSetup(loader="train_loader", found=frozenset({"loader"})))
    s = TraceSummary(step_us=[1000.0], data_us=500.0, sync_calls=10)
    found = {f.rule: f for f in rules.diagnose(s, ctx)}
    assert found["dataloader"].verify == "%loadertune train_loader"
    assert rules.diagnose(s, _ctx("cpu"))[0].verify == "%loadertune loader"  # no name known: the placeholder
    assert set(rules.VERIFY) >= {"dataloader", "amp", "dispatch_bound", "inference_grad", "batch_size", "sync",
                                 "copies", "optimizer", "gpu_idle"}


def _peaked(fraction, retries=0):
    """A CUDA context whose step set a new high-water mark at ``fraction`` of a 1000-byte GPU."""
    counters = rules.AllocatorCounters(total=1000, allocated_before=0, allocated_after=0, peak_before=0,
                                       peak_after=round(fraction * 1000))
    return cuda_context(alloc_retries=retries, allocator=counters)


def test_batch_size_fires_on_memory_pressure_and_on_a_small_batch_on_a_gpu():
    s = _gpu_summary(busy_us=19_000.0)
    pressure = rules.batch_size(s, _peaked(0.6, retries=3))
    assert pressure.title.startswith("Memory pressure: the allocator flushed its cache and retried 3 times")
    assert pressure.verify == "%autobatch --throughput step" and "expandable_segments" in pressure.snippet
    full = rules.batch_size(s, _peaked(0.97))
    assert "97% of the GPU's memory" in full.title
    small = rules.batch_size(_gpu_summary(busy_us=2_000.0), _peaked(0.05))
    assert small.title == "Small batch: the GPU idles 90% of the step with 5% of its memory in use"
    assert rules.batch_size(s, _peaked(0.5)) is None
    assert rules.batch_size(s, _ctx("cpu")) is None
    assert rules.batch_size(s, _ctx("cuda")) is None  # no allocator counters: nothing to judge


def test_memory_pressure_is_read_from_the_allocator_during_the_profile():
    from ..fakes import FakeCudaDevice

    dev = FakeCudaDevice(capacity_bytes=1000)

    def step():
        dev.allocate(980)  # 98% of the device
        dev.free(980)

    f = torchmagic.profile(step, device=dev).finding("batch_size")
    assert f is not None and "98% of the GPU's memory" in f.title


def test_memory_peak_of_the_step_not_of_earlier_work():
    from ..fakes import FakeCudaDevice

    dev = FakeCudaDevice(capacity_bytes=1000)
    dev.allocate(990)  # earlier work set the high-water mark, and the cache keeps what it reserved
    dev.free(990)

    def step():
        dev.allocate(100)
        dev.free(100)

    # reserved memory (990) would say "pressure"; the step held at most the old mark and at least 0
    r = torchmagic.profile(step, device=dev)
    assert r.finding("batch_size") is None
    assert dev.high_water == 990  # the user's peak counter is left alone


def test_a_cuda_profile_without_kernels_says_so_in_its_notes():
    # the fake device's profiles record the CPU only, as on a machine where CUPTI records nothing
    from ..fakes import FakeCudaDevice

    x = torch.randn(64, 64)
    r = torchmagic.profile(lambda: (x @ x).relu(), device=FakeCudaDevice())
    assert any(n.startswith("No GPU kernels in this profile of a CUDA device, though its steps ran 2 ops")
               for n in r.notes)


def _train_then_evaluate(evaluate: str):
    """A notebook's common cell: a training step, then an evaluation pass (how: ``evaluate``)."""
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, x_val = torch.randn(32, 64), torch.randn(256, 64)
    total = torch.zeros(())

    def step():
        nonlocal total
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if evaluate == "with grad":
            model(x_val).argmax(1)
        elif evaluate == "no_grad":
            with torch.no_grad():
                model(x_val).argmax(1)
        elif evaluate == "a running total with grad":
            total = total + loss

    return step


def test_inference_grad_finds_the_evaluation_part_of_a_cell_that_also_trains():
    mixed = profile(_train_then_evaluate("with grad")).finding("inference_grad")
    assert mixed is not None and mixed.title.startswith("Evaluation with autograd on: ")
    assert mixed.evidence["unused_graph_nodes_per_step"] >= 8 and mixed.evidence["used_graph_nodes_per_step"] >= 8
    assert "model.eval()" in mixed.snippet and "inference_mode" in mixed.snippet
    for silent in ("no_grad", "a running total with grad", "none"):
        assert "inference_grad" not in rules_of(profile(_train_then_evaluate(silent))), silent


def test_the_evaluation_part_is_found_in_a_trace_file_too(tmp_path):
    step = _train_then_evaluate("with grad")
    path = str(tmp_path / "mixed.json")
    with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
                                on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(3):
            step()
            prof.step()
    found = torchmagic.analyze(tmp_path / "mixed.json").profile.finding("inference_grad")
    assert found is not None and found.title.startswith("Evaluation with autograd on: ")


def test_inference_grad_predicts_a_bound_its_verify_can_judge():
    f = profile(w.grad_inference_step()).finding("inference_grad")
    assert f.expected is not None and f.expected.low == 1.0 < f.expected.high  # it only removes work
    assert f.verify.endswith(f"--expect 1.00-{f.expected.high:.2f}") and "removes at most" in f.expected.basis


@pytest.mark.parametrize("rule, step", [("sync", w.item_per_batch_step), ("copies", w.copy_heavy_step),
                                        ("optimizer", lambda: w.many_params_step(foreach=False))])
def test_a_fix_that_removes_work_predicts_at_most_that_works_share(rule, step):
    # the prediction its verify judges: no slower, and no faster than the removed share allows
    r = profile(step())
    f = r.finding(rule)
    removed = {"sync": "blocking_ms_per_step", "copies": "copies_ms_per_step",
               "optimizer": "optimizer_ms_per_step"}[rule]
    share = f.evidence[removed] / (r.median_step_s * 1e3)
    assert f.expected.low == 1.0
    # compared as shares: 1/(1-s) is steep near the cap, and the bound rests on the steady step, not the median
    assert 1 - 1 / f.expected.high == pytest.approx(min(share, MOST_REMOVED), abs=0.05)
    assert f.expected.basis.startswith("the fix removes at most")
    assert f.verify.endswith(f"--verify {f.expected.option()}")  # judged in rounds against this profile's cell


def test_gpu_rules_that_remove_work_predict_their_bound():
    s = _gpu_summary(busy_us=5_000.0)
    idle = rules.gpu_idle(s, _ctx())
    assert (idle.expected.low, idle.expected.high) == (1.0, 4.0)  # 75% idle: at most 4x
    assert "the GPU's idle time: 75%" in idle.expected.basis


def _many_tiny_ops(code: str):
    """A dispatch-bound CPU step (960 ops of 3 µs a step, the Python between them) and its context, the code
    keyed as a magic keys it: what the rule reads, without a live profile's timing (a loaded machine can
    stretch tiny ops past the rule's threshold)."""
    from torchmagic.core import expectations
    s = TraceSummary(step_us=[2000.0, 2000.0], python_op_us=[3.0] * 960)
    s.category_us["other"] = 1000.0
    return s, dataclasses.replace(_ctx("cpu"), code=expectations.code_key(code))


def test_dispatch_bound_reads_what_amp_compare_measured_compile_at_on_that_code():
    from torchmagic.core import expectations
    code = "for _ in range(60): small(x)"
    s, ctx = _many_tiny_ops(code)
    expectations.remember("dispatch_bound", ctx.code, expectations.Measured(0.46, (0.42, 0.51)))
    try:
        f = rules.dispatch_bound(s, ctx)
    finally:
        expectations._MEASURED.clear()
    assert "torch.compile measured 0.46x on this code" in f.fix and "torch.compile(" not in f.snippet
    assert f.evidence["compile_measured"] == [0.46, 0.42, 0.51] and f.expected is None


def test_dispatch_bound_predicts_compile_only_from_a_measurement():
    # a compiled call's own fixed cost can exceed what fusing saves (0.47x on the tour's one-item calls):
    # the trace cannot tell, so unmeasured there is no figure; measured faster, the measurement is the prediction
    from torchmagic.core import expectations
    s, ctx = _many_tiny_ops("for _ in range(60): small(x)")
    unmeasured = rules.dispatch_bound(s, ctx)
    assert unmeasured.expected is None and "not in the trace" in unmeasured.fix
    assert unmeasured.verify == "%%amp_compare --variants eager,compile"
    expectations.remember("dispatch_bound", ctx.code, expectations.Measured(1.8, (1.6, 2.0)))
    try:
        f = rules.dispatch_bound(s, ctx)
    finally:
        expectations._MEASURED.clear()
    assert (f.expected.low, f.expected.high) == (1.6, 2.0) and f.verify.endswith("--expect 1.60-2.00")
    assert "torch.compile measured 1.80x on this code" in f.fix and "torch.compile(" in f.snippet


def test_a_finding_given_its_severity_as_a_string_holds_the_type():
    f = Finding(rule="sync", severity="medium", title="t", evidence={}, fix="f", snippet="s")
    assert f.severity is Severity.MEDIUM and f.severity.rank == 1
    with pytest.raises(ValueError):
        Finding(rule="sync", severity="urgent", title="t", evidence={}, fix="f", snippet="s")
