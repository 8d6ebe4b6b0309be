"""The GPU tier: what no fake can tell, checked on a real CUDA device in a few minutes.

Run on a GPU machine with `python -m pytest -m gpu` (or, on one that reaches no package index,
`bash .gpu-wheels/on-device.sh -m gpu`, see the README); everything here skips without CUDA.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import torchmagic

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

WIDE = 4096


def train_step_4096():
    model = nn.Linear(WIDE, WIDE).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(WIDE, WIDE, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return model, step


def test_a_cpu_model_on_a_gpu_machine_never_initialises_cuda():
    """In a fresh process (this one has used CUDA): every magic's engine on a CPU model."""
    code = textwrap.dedent("""
        import torch, torchmagic
        from torch import nn
        model = nn.Linear(64, 64)
        x = torch.randn(32, 64)
        r = torchmagic.profile(lambda: model(x).sum().backward(), steps=2)
        assert r.device.label == "cpu", r.device
        c = torchmagic.compare(lambda m: m(x), model=model, variants="eager,amp,int8", runs=2, min_time=0.01, warmup=0)
        assert c.device.label == "cpu" and all(v.ok for v in c.variants), [v.error for v in c.variants]
        b = torchmagic.autobatch(lambda bs: model(torch.randn(bs, 64)).sum().backward(), budget=2**26, max=512,
                                 estimate=False)
        assert b.device.label == "cpu" and b.batch_size
        m = torchmagic.measure_memory(lambda: model(x))
        assert m.cell.device == "cpu"
        assert not torch.cuda.is_initialized(), "CPU work initialised CUDA"
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_profile_of_a_4096_linear_training_step_attributes_kernels_and_finds_amp():
    model, step = train_step_4096()
    r = torchmagic.profile(step, steps=3, warmup=2)
    assert r.device.label.startswith("cuda") and r.device.chosen == "where the code's tensors are"
    device_us = {op.name: op.self_device_us for op in r.ops}
    gemm = sum(us for name, us in device_us.items() if name in ("aten::mm", "aten::addmm"))
    assert gemm > 0.5 * sum(device_us.values()), device_us  # the GEMMs are most of the kernel time
    if torch.cuda.get_device_capability()[0] >= 7:
        assert r.finding("amp") is not None, r.to_text()
    assert not any("No GPU kernels" in note for note in r.notes)


def test_work_on_the_second_gpu_is_measured_there():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.randn(2048, 2048, device="cuda:1")
    m = torchmagic.measure_memory(lambda: x @ x)
    assert m.cell.device == "cuda:1" and m.cell.peak_bytes >= 2048 * 2048 * 4


@pytest.mark.parametrize("variant", ["eager", "compile", "compile:reduce-overhead"])
def test_compare_peaks_match_the_allocators_high_water_mark(variant):
    model = nn.Sequential(nn.Linear(WIDE, WIDE), nn.ReLU(), nn.Linear(WIDE, WIDE)).cuda().eval()
    x = torch.randn(1024, WIDE, device="cuda")
    with torch.no_grad():
        variants = "eager" if variant == "eager" else f"eager,{variant}"
        r = torchmagic.compare(lambda m: m(x), model=model, variants=variants, runs=3, min_time=0.05)
    v = r[variant]
    assert v.ok, v.error
    # the allocator's own view of one call of the same code, from a reset high-water mark
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        model(x)
    torch.cuda.synchronize()
    eager_peak = torch.cuda.max_memory_allocated() - base
    if variant == "eager":
        assert abs(v.peak_bytes - eager_peak) <= 0.05 * eager_peak + 2**20, (v.peak_bytes, eager_peak)
    else:  # compiled code may fuse and reuse buffers; CUDA graphs allocate their pool at record time
        assert v.peak_bytes is not None and (v.peak_bytes > 0 or v.graph_pool_bytes), v


def test_compare_timing_agrees_with_cuda_events_on_a_4096_matmul():
    a = torch.randn(WIDE, WIDE, device="cuda")
    r = torchmagic.compare(lambda: a @ a, variants="eager", min_time=1.0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        a @ a
    calls = 100
    start.record()
    for _ in range(calls):
        a @ a
    end.record()
    torch.cuda.synchronize()
    event_s = start.elapsed_time(end) / 1000 / calls
    assert abs(r["eager"].median_s / event_s - 1) < 0.05, (r["eager"].median_s, event_s)


def test_autobatch_bisects_through_a_real_out_of_memory_and_puts_everything_back():
    model = nn.Sequential(nn.Linear(WIDE, WIDE), nn.ReLU(), nn.Linear(WIDE, WIDE)).cuda()
    opt = torch.optim.Adam(model.parameters())
    weights = [p.detach().clone() for p in model.parameters()]

    def step(bs):
        opt.zero_grad()
        model(torch.randn(bs, WIDE, device="cuda")).square().mean().backward()
        opt.step()

    # cuBLAS's workspace (32 MiB on Hopper) is allocated at the first GEMM and kept by torch for good
    model(torch.randn(1, WIDE, device="cuda")).sum().backward()
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    r = torchmagic.autobatch(step, budget=1.0, margin=0.0, max=2**24, estimate=False)
    assert r.batch_size and any(not t.ran for t in r.trials), r.to_text()  # a real OOM, then bisection
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    assert not opt.state  # Adam's moments, created by the probes, dropped again
    assert torch.cuda.memory_allocated() <= before + 2**20


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch without the new TF32 API")
def test_tf32_through_either_api_takes_effect_in_the_variant_and_is_put_back():
    """With TF32 off through either API, the tf32 variant's matmuls carry TF32's error (10-bit mantissa:
    about 1e-3 relative at K=1024) and eager's fp32's (about 1e-6); afterwards the setting reads as before."""
    for api in ("legacy", "new"):
        code = textwrap.dedent(f"""
            import torch, torchmagic
            if "{api}" == "new":
                torch.backends.cuda.matmul.fp32_precision = "ieee"
                read = lambda: torch.backends.cuda.matmul.fp32_precision
            else:
                torch.backends.cuda.matmul.allow_tf32 = False
                read = lambda: torch.backends.cuda.matmul.allow_tf32
            before = read()
            a = torch.randn(1024, 1024, device="cuda")
            exact = (a.double() @ a.double())
            errors = []

            def matmul():
                out = a @ a
                errors.append(((out.double() - exact).abs().max() / exact.abs().max()).item())

            r = torchmagic.compare(matmul, variants="eager,tf32", runs=3, min_time=0.05)
            assert r["tf32"].ok, r["tf32"].error
            assert min(errors) < 1e-5, ("eager ran in TF32", min(errors))
            assert max(errors) > 1e-4, ("the tf32 variant did not run in TF32", max(errors))
            assert read() == before
            print("ok")
        """)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "ok" in done.stdout, (api, done.stderr[-3000:])


def test_gpumem_reads_nvml_including_this_process():
    held = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    r = torchmagic.memory({"held": held})
    d = next(d for d in r.devices if d.label == f"cuda:{torch.cuda.current_device()}")
    assert d.used_bytes is not None and d.used_bytes >= d.reserved_bytes >= 256 * 2**20, d
    notes = " ".join(d.notes)
    # this process is found in NVML's list (by PID, or by elimination in a container), or the note names
    # the entries it cannot tell apart; never counted among the other processes
    assert (d.this_process_bytes or 0) >= 256 * 2**20 or "cannot tell" in notes, notes
    assert os.getpid() not in [pid for pid, _ in d.other_processes], d.other_processes
    assert r.variables[0].name == "held"


def test_the_tour_notebook_runs_unchanged_on_a_gpu_machine():
    """The tour's tensors are on the CPU: on a GPU machine it must still run, measuring where its data is."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "--nbval-lax", "-p", "no:cacheprovider",
                           "notebooks/00_tour.ipynb"], cwd=root, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:]
