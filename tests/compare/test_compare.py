"""torchmagic.compare on CPU with real autocast, inference mode and int8: statistics, numerics,
failures and state safety.  torch.compile has its own module (test_compare_compile.py)."""

import threading
import weakref

import pytest
import torch
from torch import nn

import torchmagic
from torchmagic import Technique, Variant
from torchmagic.core.settings import TorchSettings
from torchmagic.core.devices import LowPrecision
from torchmagic.features.compare.options import CompareOptions
from torchmagic.features.compare.run import advance_notes
from torchmagic.features.compare.variants import Env, parse_variants

from ..fakes import FakeCudaDevice, FastBf16Cpu
from ..processes import busy_cores


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16))


def twice(model, env):
    """A deliberately slower model: the same output, computed twice."""
    def run(x):
        model(x)
        return model(x)
    return run


def off_by_5_percent(model, env):
    return lambda x: model(x) * 1.05


SLOW = Variant("slow", (Technique("slow", build=twice),))
WRONG = Variant("wrong", (Technique("wrong", build=off_by_5_percent),))


def test_a_slowed_variant_is_slower_with_a_ci_that_excludes_one():
    net, x = mlp(), torch.randn(512, 64)  # enough work per call that Python's per-call cost does not hide it
    with torch.no_grad():
        r = torchmagic.compare(lambda m: m(x), model=net, variants=["eager", SLOW], runs=15, warmup=1)
    slow = r["slow"]
    assert r.rounds == 15 and len(slow.samples_s) == 15 and len(r.baseline.samples_s) == 15
    assert slow.verdict == "slower" and slow.ci[1] < 1 and slow.ci[0] <= slow.speedup <= slow.ci[1]
    assert 0.3 < slow.speedup < 0.8  # about twice the work (the second call finds warm caches)
    assert slow.numerics_ok is True and slow.max_abs_err == 0
    assert r.best is r.baseline and r.headline().startswith("eager (float32, cpu) is fastest")
    assert f"slow (float32, cpu) {1 / slow.speedup:.2f}× slower" in r.headline()


def test_a_busy_machine_is_said_with_how_long_the_rounds_waited_for_a_cpu():
    net, x = mlp(), torch.randn(32, 64)
    with busy_cores():
        r = torchmagic.compare(lambda m: m(x), model=net, variants=["eager", "inference_mode"], runs=6, warmup=1)
    busy = [note for note in r.notes if note.startswith("the machine was busy")]
    assert len(busy) == 1 and "waited for a CPU" in busy[0] and "--min-time" in busy[0], r.notes
    assert int(busy[0].split("CPU ")[1].split("%")[0]) >= 15  # one busy loop per core: 28-50% here, 0.3% free


def test_a_wrong_variant_is_flagged_and_never_best():
    net, x = mlp(), torch.randn(32, 64)
    with torch.no_grad():
        r = torchmagic.compare(lambda m: m(x), model=net, variants=["eager", WRONG], runs=5, warmup=0)
    wrong = r["wrong"]
    assert wrong.numerics_ok is False and wrong.max_rel_err == pytest.approx(0.05, rel=1e-3)
    assert wrong.tolerance == (1e-4, 1e-6)  # fp32 tolerance: the variant claims full precision
    assert "error over tolerance" in wrong.flags() and not wrong.trustworthy
    assert r.best.name == "eager"
    assert "✗" in r.to_text()


def test_a_failing_variant_is_reported_and_the_others_go_on():
    def broken(model, env):
        raise RuntimeError("this variant cannot be built\nsecond line")

    net, x = mlp(), torch.randn(8, 64)
    bad = Variant("broken", (Technique("broken", build=broken),))
    r = torchmagic.compare(lambda m: m(x).sum(), model=net, variants=["eager", bad, "amp"], runs=6, warmup=0)
    assert not r["broken"].ok and r["broken"].error == "RuntimeError: this variant cannot be built"
    assert r["amp"].ok and r["amp"].median_s > 0 and r["amp"].ci is not None
    assert "broken failed: RuntimeError" in r.to_text()


def test_inference_only_variants_fail_on_a_training_step_with_a_hint():
    net, x = mlp(), torch.randn(8, 64)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def step(m):
        opt.zero_grad()
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    r = torchmagic.compare(step, model=net, variants="eager,inference_mode,int8", runs=3, warmup=0)
    for name in ("inference_mode", "int8"):
        assert not r[name].ok and f"{name} is for inference" in r[name].error


def test_inference_variants_measure_int8_and_inference_mode():
    net, x = mlp(), torch.randn(64, 64)
    r = torchmagic.compare(lambda m: m(x), model=net, variants="eager,inference_mode,int8,amp", runs=5, warmup=1)
    assert r["inference_mode"].numerics_ok and r["inference_mode"].max_abs_err == 0
    int8 = r["int8"]
    assert int8.ok and int8.precision == "int8" and 0 < int8.max_rel_err < 0.1 and int8.numerics_ok
    assert int8.compile_s is not None  # quantizing is its one-time cost
    amp = r["amp"]
    assert amp.precision == "bf16" and 0 < amp.max_rel_err < 0.05 and amp.numerics_ok
    assert all(v.peak_bytes and v.peak_bytes > 0 for v in r.variants)
    assert isinstance(net[0], nn.Linear)  # int8 quantized a copy


def test_training_state_is_bit_identical_afterwards():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    x, y = torch.randn(32, 16), torch.randn(32, 4)

    def step(m):
        opt.zero_grad()
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        sched.step()
        return loss

    step(net)  # optimizer state, grads and a scheduler position exist before the comparison
    params = [p.detach().clone() for p in net.parameters()]
    grads = [p.grad.clone() for p in net.parameters()]
    buffers = [b.clone() for b in net.buffers()]
    opt_state = {k: {n: t.clone() for n, t in v.items()} for k, v in opt.state_dict()["state"].items()}
    sched_state, rng = sched.state_dict(), torch.get_rng_state()
    settings = TorchSettings.capture()

    r = torchmagic.compare(step, model=net, variants="eager,amp,tf32", runs=4, warmup=1)
    assert r["amp"].ok and r["tf32"].ok
    assert all(torch.equal(a, b) for a, b in zip(params, net.parameters()))
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, net.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(buffers, net.buffers()))
    after = opt.state_dict()["state"]
    assert all(torch.equal(opt_state[k][n], after[k][n]) for k in opt_state for n in opt_state[k])
    assert sched.state_dict() == sched_state and opt.param_groups[0]["lr"] == sched.get_last_lr()[0]
    assert torch.equal(torch.get_rng_state(), rng) and net.training
    assert TorchSettings.capture() == settings


def test_no_restore_leaves_the_training_done():
    net, x = mlp(), torch.randn(8, 64)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = net[0].weight.detach().clone()

    def step(m):
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()

    r = torchmagic.compare(step, model=net, variants="eager", runs=2, warmup=0, restore=False)
    assert not torch.equal(before, net[0].weight) and any("--no-restore" in n for n in r.notes)
    assert r.baseline.numerics_ok is None and "no numerics check" not in r.to_text()


def test_the_users_own_error_propagates_and_state_is_restored():
    net, x = mlp(), torch.randn(8, 64)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = net[0].weight.detach().clone()
    settings = TorchSettings.capture()
    calls = []

    def step(m):
        calls.append(1)
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
        if len(calls) == 3:  # eager's first run and two warm-ups pass, then it breaks
            raise ValueError("the user's bug")

    with pytest.raises(ValueError, match="the user's bug"):
        torchmagic.compare(step, model=net, variants="eager,amp", runs=3, warmup=2)
    assert torch.equal(before, net[0].weight) and opt.state_dict()["state"] == {}
    assert TorchSettings.capture() == settings


def test_keyboard_interrupt_stops_restores_and_keeps_what_ran():
    net, x = mlp(), torch.randn(8, 64)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    before = net[0].weight.detach().clone()
    settings = TorchSettings.capture()
    calls = []

    def step(m):
        calls.append(torch.is_autocast_enabled("cpu"))
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
        if len(calls) == 2000:  # a round is ~70 ms of calls (each block: 10 ms untimed, 25 ms timed): a few rounds in
            raise KeyboardInterrupt  # as the user pressing stop, inside an autocast variant or not

    with pytest.raises(KeyboardInterrupt) as info:
        torchmagic.compare(step, model=net, variants="eager,amp", runs=1000, warmup=1)
    partial = info.value.torchmagic_result
    assert 0 < partial.rounds < 1000 and "interrupted" in partial.notes[-1]
    assert any(calls) and torch.equal(before, net[0].weight) and opt.state_dict()["state"] == {}
    assert TorchSettings.capture() == settings


def test_sigint_from_a_timer_thread_interrupts_cleanly():
    import _thread

    net, x = mlp(), torch.randn(8, 64)
    settings = TorchSettings.capture()
    done = threading.Event()

    def press_ctrl_c():  # again every half second, as a user would: Python drops a KeyboardInterrupt
        while not done.wait(0.5):  # that lands in a gc callback (hypothesis leaves one installed)
            _thread.interrupt_main()

    presser = threading.Thread(target=press_ctrl_c)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            torchmagic.compare(lambda m: m(x), model=net, variants="eager,amp,inference_mode", min_time=30)
    finally:
        done.set()
        presser.join()
    assert TorchSettings.capture() == settings and not torch.is_inference_mode_enabled()


def test_channels_last_runs_in_its_layout_and_puts_the_original_back():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 3, 16, 16)
    seen = []

    def step(m):
        seen.append(net[0].weight.is_contiguous(memory_format=torch.channels_last))
        opt.zero_grad()
        out = m(x)
        out.square().mean().backward()
        opt.step()
        return out

    before = [p.detach().clone() for p in net.parameters()]
    r = torchmagic.compare(step, model=net, variants="eager,channels_last", runs=3, warmup=0)
    cl = r["channels_last"]
    assert cl.ok and cl.numerics_ok and cl.max_rel_err < 1e-4
    assert any(seen) and not all(seen)  # each variant saw its own layout
    assert all(p.is_contiguous() for p in net.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    linear_only = mlp()
    r = torchmagic.compare(lambda m: m(torch.randn(2, 64)), model=linear_only, variants="eager,channels_last", runs=2)
    assert "no 4-D weights" in r["channels_last"].error


def test_without_a_model_only_context_variants_run():
    x = torch.randn(64, 64)
    r = torchmagic.compare(lambda: x @ x, variants="eager,amp,compile", runs=3, warmup=0)
    assert r["amp"].ok and r["amp"].numerics_ok
    assert not r["compile"].ok and "needs the model" in r["compile"].error


def test_outputs_with_nothing_numeric_get_a_note():
    r = torchmagic.compare(lambda: "text", variants="eager,amp", runs=2, warmup=0)
    assert r["amp"].numerics_ok is None and "no numerics check" in r.to_text()


def test_parse_variants():
    names = [v.name for v in parse_variants("amp, compile+amp ,eager")]
    assert names == ["eager", "amp", "compile+amp"]
    assert [v.name for v in parse_variants("amp")] == ["eager", "amp"]
    assert parse_variants("compile:max-autotune+amp")[1].compiles
    for bad, message in [("amp,amp", "twice"), ("fast", "unknown variant part 'fast'"),
                         ("compile+compile:max-autotune", "compiles twice"), ("amp,", "names such as")]:
        with pytest.raises(ValueError, match=message):
            parse_variants(bad)


@pytest.mark.parametrize("kwargs, message", [
    ({"runs": 1}, "at least 2"), ({"min_time": 0}, "positive"), ({"warmup": -1}, "negative"),
    ({"dtype": "int4"}, "bf16 or fp16"), ({"rtol": -1.0}, "non-negative"),
])
def test_bad_options_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        torchmagic.compare(lambda: 1, **kwargs)


def test_on_a_gpu_peaks_come_from_the_device_and_an_oom_variant_is_contained():
    from ..fakes import FakeCudaDevice

    dev = FakeCudaDevice(capacity_bytes=1000)

    def step(model):  # a step whose activations take 300 bytes on the device, freed at its end
        dev.allocate(300)
        try:
            return model(torch.ones(2, 2))
        finally:
            dev.free(300)

    def hungry(model, env):  # a variant that needs more than the device has
        def run(x):
            dev.allocate(900)
            dev.free(900)
            return model(x)
        return run

    r = torchmagic.compare(step, model=nn.Identity(), device=dev, runs=3, warmup=1,
                           variants=["eager", Variant("hungry", (Technique("hungry", build=hungry),)), SLOW])
    assert r.baseline.peak_bytes == 300 and r["slow"].peak_bytes == 300 and r["slow"].ok
    assert not r["hungry"].ok and r["hungry"].error == "out of memory"
    assert dev.cache_empties >= 1 and dev.allocated == 0  # freed, then the cache emptied
    assert r.device.name == "Fake H100"
    # every timed block and every single timed run waits for the device at both ends
    assert dev.syncs >= 2 * (3 * 2 + 2 * (1 + 1))


@pytest.mark.parametrize("fail_on_call", [1, 6])  # on its first run, and in the timed rounds
def test_a_failed_variants_tensors_are_gone_when_the_cache_is_emptied(fail_on_call):
    """The allocator can only hand back memory nothing holds: the failing run's frames (kept by
    its traceback) must be dropped before empty_cache is called."""
    import weakref

    from ..fakes import FakeCudaDevice

    held = []

    class Device(FakeCudaDevice):
        emptied_with_alive = []

        def empty_cache(self):
            self.emptied_with_alive.append(any(ref() is not None for ref in held))
            super().empty_cache()

    def leaky(model, env):
        calls = []

        def run(x):
            calls.append(1)
            activations = torch.ones(1000)  # what a failing step holds, on the GPU for real
            held.append(weakref.ref(activations))
            if len(calls) == fail_on_call:
                raise RuntimeError("boom")
            return model(x)
        return run

    dev = Device()
    variants = ["eager", Variant("leaky", (Technique("leaky", build=leaky),))]
    r = torchmagic.compare(lambda m: m(torch.ones(2)), model=nn.Identity(), variants=variants, runs=6, warmup=0,
                           device=dev)
    assert not r["leaky"].ok and "boom" in r["leaky"].error
    # the cache is emptied after the failure and before each block of rounds: never with the failed run's tensors
    assert dev.emptied_with_alive and not any(dev.emptied_with_alive)


def test_int8_quantizes_a_bare_linear_or_lstm_and_never_passes_fp32_off_as_int8():
    torch.manual_seed(0)
    lstm, x = nn.LSTM(16, 32, batch_first=True), torch.randn(4, 5, 16)

    def forward(m):
        with torch.inference_mode():
            return m(x)[0]

    r = torchmagic.compare(forward, model=lstm, variants="eager,int8", runs=3, warmup=0)
    assert r["int8"].ok and r["int8"].max_rel_err > 0  # really quantized: its output differs a little
    assert isinstance(lstm, nn.LSTM)  # the user's model is untouched
    linear = nn.Linear(16, 8)
    r = torchmagic.compare(lambda m: m(torch.ones(2, 16)), model=linear, variants="eager,int8", runs=2, warmup=0)
    assert r["int8"].ok and r["int8"].max_rel_err > 0


def test_model_must_be_a_module():
    with pytest.raises(TypeError, match="model= takes the nn.Module"):
        torchmagic.compare(lambda o: None, model=torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))


class _Activations(nn.Module):
    """An identity whose eager forward holds 300 bytes of activations on the fake device."""

    def __init__(self, dev):
        super().__init__()
        self.dev = dev

    def forward(self, x):
        self.dev.allocate(300)
        self.dev.free(300)
        return x


class _FakeGraphs:
    """What torch.compile(mode="reduce-overhead") does to device memory on CUDA: its first runs
    (warm-up, then recording) take their memory from a graph pool it keeps while it lives; a replay
    allocates nothing."""

    def __init__(self, dev, events):
        self.dev, self.events, self.runs = dev, events, 0
        weakref.finalize(self, dev.release_pool, id(self))

    def __call__(self, x):
        self.events.append("graph run")
        self.runs += 1
        if self.runs <= 2:
            self.dev.record_pool(id(self), 4096)
        with _compiled_graph_call():
            return x


def _compiled_graph_call():
    """What inductor records around each compiled graph it runs while a profiler is on: the comparison
    reads it to tell a compiled variant's runs from eager ones (a fake compile makes none of its own)."""
    return torch.profiler.record_function("## Call CompiledFxGraph fake ##")


class _FakeCompiled(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        with _compiled_graph_call():
            return self.model(*args)


def _compare_with_fake_graphs(monkeypatch, dev, kept=None):
    events = []

    def fake_compile(model, mode=None):
        assert mode == "reduce-overhead"
        graphs = _FakeGraphs(dev, events)
        if kept is not None:
            kept.append(graphs)
        return graphs

    def step(model):
        events.append("step")
        return model(torch.ones(2, 2))

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: events.append("mark"))
    r = torchmagic.compare(step, model=_Activations(dev), device=dev, runs=4, warmup=2,
                           variants="eager,compile:reduce-overhead")
    return r, events


def test_cuda_graph_pools_are_reported_and_given_back_at_the_end(monkeypatch):
    from ..fakes import FakeGraphCudaDevice

    dev = FakeGraphCudaDevice()
    r, events = _compare_with_fake_graphs(monkeypatch, dev)
    graphs = r["compile:reduce-overhead"]
    assert graphs.ok and graphs.graph_pool_bytes == 8192 and r.baseline.graph_pool_bytes is None
    assert graphs.peak_bytes == 0 and r.baseline.peak_bytes == 300  # a replay allocates nothing
    assert "CUDA graph pool: 8.0 KiB, allocated when its graphs were recorded" in " ".join(graphs.notes)
    assert "graph pool" in r.to_text() and "8.0 KiB" in r.to_html()
    assert dev.graph_pool_bytes() == 0 and dev.memory_reserved() == 0  # given back for %gpumem and %autobatch
    assert not any("still hold" in note for note in r.notes)

    # a new cudagraph-trees step is marked right before every run of the graph variant, never for eager
    graph_runs = [i for i, e in enumerate(events) if e == "graph run"]
    assert events.count("mark") == len(graph_runs) >= 1 + 2 + 1 + 1 + 4  # first, warm-up, graph calls, peak, rounds
    assert all(events[i - 2: i] == ["mark", "step"] for i in graph_runs)


def test_cuda_graph_pools_something_else_keeps_are_named(monkeypatch):
    from ..fakes import FakeGraphCudaDevice

    dev, kept = FakeGraphCudaDevice(), []
    r, _ = _compare_with_fake_graphs(monkeypatch, dev, kept)
    assert dev.graph_pool_bytes() == 8192
    assert any("CUDA graph pools still hold 8.0 KiB" in note and "torch._dynamo.reset()" in note for note in r.notes)


def test_no_cuda_graph_steps_off_cuda(monkeypatch):
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: _FakeCompiled(model))
    r = torchmagic.compare(lambda m: m(torch.ones(2)), model=nn.Identity(), runs=2, warmup=0,
                           variants="eager,compile:reduce-overhead")
    assert r["compile:reduce-overhead"].ok and r["compile:reduce-overhead"].graph_pool_bytes is None
    assert marks == [] and "graph pool" not in r.to_text()


def test_every_variant_names_its_dtype_and_device_in_the_data_the_table_and_the_headline():
    net, x = mlp(), torch.randn(32, 64)
    with torch.no_grad():
        r = torchmagic.compare(lambda m: m(x), model=net, variants="eager,amp,int8,int8+amp,inference_mode",
                               runs=3, warmup=0, device=FastBf16Cpu(fast=True))
    assert {v.name: (v.dtype, v.device) for v in r.variants} == {
        "eager": ("float32", "cpu"), "amp": ("bfloat16", "cpu"), "int8": ("int8 dynamic", "cpu"),
        "int8+amp": ("int8 dynamic+bfloat16", "cpu"), "inference_mode": ("float32", "cpu")}
    data = r.to_dict()
    assert [(v["name"], v["dtype"], v["device"]) for v in data["variants"]][1] == ("amp", "bfloat16", "cpu")
    rows = {line.split()[0]: line for line in r.to_text().splitlines()[3:8]}
    assert "bfloat16, cpu" in rows["amp"] and "int8 dynamic, cpu" in rows["int8"]
    assert r.headline().startswith(f"{r.best.name} ({r.best.dtype}, cpu)")


def test_dtype_follows_the_amp_dtype_and_the_device():
    variants = {v.name: v for v in parse_variants("eager,amp,compile+amp,tf32,tf32+amp,int8")}
    fp16_cpu, gpu = Env(FastBf16Cpu(), torch.float16), Env(FakeCudaDevice(), torch.bfloat16)
    assert variants["amp"].dtype(fp16_cpu) == "float16" and variants["compile+amp"].dtype(gpu) == "bfloat16"
    assert variants["tf32"].dtype(gpu) == "tf32" and variants["tf32+amp"].dtype(gpu) == "tf32+bfloat16"
    assert variants["eager"].dtype(gpu) == "float32" and variants["int8"].dtype(gpu) == "int8 dynamic"
    dev = FakeCudaDevice()
    r = torchmagic.compare(lambda m: m(torch.ones(2, 2)), model=nn.Identity(), device=dev, runs=2, warmup=0,
                           variants="eager,tf32")
    assert (r["tf32"].dtype, r["tf32"].device) == ("tf32", "cuda:0") and r.baseline.runs_as == "float32, cuda:0"


AMP_NOTE = ("amp: declared by the test, so bfloat16 autocast is expected to run slower than float32 here; "
            "measuring anyway")


@pytest.mark.parametrize("fast", [False, True])
def test_amp_on_a_cpu_without_fast_bf16_says_so_and_is_measured_anyway(fast):
    net, x = mlp(), torch.randn(32, 64)
    with torch.no_grad():
        r = torchmagic.compare(lambda m: m(x), model=net, variants="eager,amp", runs=6, warmup=0,
                               device=FastBf16Cpu(fast=fast))
    amp = r["amp"]
    assert amp.ok and amp.median_s > 0 and amp.ci is not None and amp.numerics_ok  # measured all the same
    assert (AMP_NOTE in r.notes) is not fast and (AMP_NOTE in r.to_text()) is not fast
    if fast:
        assert not any("autocast is expected" in note for note in r.notes + amp.notes)


class _SlowLowPrecisionGpu(FakeCudaDevice):
    def low_precision(self) -> LowPrecision:
        return LowPrecision(False, torch.float16, "compute capability 6.1: no tensor cores")


def test_the_advance_note_uses_the_devices_reason_and_names_every_autocast_variant():
    def options(spec, dtype=None):
        return CompareOptions(variants=tuple(parse_variants(spec)), dtype=dtype)

    slow_cpu = FastBf16Cpu(fast=False)
    assert advance_notes(options("eager,compile,tf32"), slow_cpu) == []  # nothing autocasts
    assert advance_notes(options("eager,amp,compile+amp"), FastBf16Cpu(fast=True)) == []
    assert advance_notes(options("eager,amp,compile+amp"), FakeCudaDevice()) == []
    assert advance_notes(options("eager,amp,compile+amp", "fp16"), slow_cpu) == [
        ("amp, compile+amp: declared by the test, so float16 autocast is expected to run slower than float32 "
         "here; measuring anyway")]
    assert advance_notes(options("amp"), _SlowLowPrecisionGpu()) == [
        ("amp: compute capability 6.1: no tensor cores, so float16 autocast is expected to run no faster than "
         "float32 here; measuring anyway")]


def test_every_amp_call_pays_for_its_casts_as_a_step_of_a_loop_does():
    """autocast keeps the bf16 copies of the weights it cast until its context closes; a block of calls in one
    context found them cast after its first call (measured: 1 cast a call instead of 3), which no step of a
    training loop, each in its own ``with autocast()``, ever does."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Casts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func is torch.ops.aten._to_copy.default
            return func(*args, **(kwargs or {}))

    model, x, seen = nn.Linear(64, 64), torch.randn(8, 64), []

    def step(m):
        with Casts() as casts:
            out = m(x)
        seen.append((torch.is_autocast_enabled("cpu"), casts.count))
        return out

    r = torchmagic.compare(step, model=model, variants=["eager", "amp"], runs=6, warmup=1)
    assert r["amp"].calls_per_sample > 1  # blocks of several calls, where the cache would show
    assert {count for autocast, count in seen if autocast} == {3}  # the input, the weight and the bias, every call


def test_a_per_step_context_is_entered_and_timed_on_every_call_and_a_setting_around_the_calls_is_not():
    """A loop writes ``with torch.autocast(...):`` around each step and pays for entering it each time (about
    2 µs, 10% of a 20 µs step); a setting made once (tf32, a layout) is outside the timed region."""
    import contextlib
    import time

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    entered = {"per_step": 0, "around": 0}

    def costly(name):
        @contextlib.contextmanager
        def context(model, env):
            entered[name] += 1
            spin(0.002)
            yield
        return context

    per_step = Variant("per_step", (Technique("per_step", in_step=costly("per_step")),))
    around = Variant("around", (Technique("around", around_call=costly("around")),))
    r = torchmagic.compare(lambda: spin(0.002), variants=["eager", per_step, around], runs=6, warmup=1)
    step, setting = r["per_step"], r["around"]
    timed_calls = r.rounds * step.calls_per_sample
    assert entered["per_step"] > timed_calls  # each timed call, and the untimed ones (lead-ins, warm-ups, peak)
    assert entered["around"] < r.rounds + 10  # once a block, warm-up or first run
    assert 0.35 < step.speedup < 0.65 and step.verdict == "slower"  # 2 ms of step and 2 ms of context a call
    # the setting's 2 ms are outside the timed region (timed, it would read 0.5x, as per_step does); no upper
    # bound: a busy-wait step is wall time, and a preemption in eager's rounds read 1.25x on a loaded CI
    assert setting.speedup > 0.8
