"""The device layer: OOM classification, NVML access, device injection, the fake CUDA device."""

import types

import pytest
import torch

import torchmagic
from torchmagic.devices import CpuDevice, current_device, is_out_of_memory, nvml_reading, use_device

from .fakes import FakeCudaDevice


@pytest.mark.parametrize("exc, oom", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"), True),
    (RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"), True),
    (MemoryError(), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    (ValueError("out of memory"), False),
])
def test_is_out_of_memory(exc, oom):
    assert is_out_of_memory(exc) is oom


def test_real_cpu_allocation_failure_is_classified():
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**62, dtype=torch.uint8)
    assert is_out_of_memory(info.value)


def test_fake_device_raises_torch_oom_past_capacity():
    dev = FakeCudaDevice(capacity_bytes=1000)
    dev.allocate(900)
    with pytest.raises(torch.OutOfMemoryError) as info:
        dev.allocate(200)
    assert is_out_of_memory(info.value) and dev.memory_allocated() == 900


def test_use_device_injects_and_nests():
    outer, inner = FakeCudaDevice(name="A"), FakeCudaDevice(name="B")
    with use_device(outer):
        assert current_device() is outer
        with use_device(inner):
            assert current_device() is inner
        assert current_device() is outer
    assert current_device().kind in ("cpu", "cuda", "mps")


def test_cpu_device_reports_low_precision_and_note():
    dev = CpuDevice()
    lp = dev.low_precision()
    assert isinstance(lp.fast, bool) and lp.reason
    assert "CPU-only" in dev.profile_note()
    assert dev.nvml() is None


class FakeNvml(types.SimpleNamespace):
    NVML_TEMPERATURE_GPU = 0


def fake_nvml(fail_init=None, fail_power=False):
    calls = []

    def init():
        if fail_init:
            raise fail_init

    def power(handle):
        if fail_power:
            raise RuntimeError("Not Supported")
        return 250_000

    return FakeNvml(
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByUUID=lambda uuid: calls.append(("uuid", uuid)) or "h",
        nvmlDeviceGetHandleByIndex=lambda i: calls.append(("index", i)) or "h",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * 2**30, used=2 * 2**30),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=93),
        nvmlDeviceGetTemperature=lambda h, kind: 55,
        nvmlDeviceGetPowerUsage=power,
        calls=calls,
    )


def test_nvml_reading_by_uuid_survives_unsupported_fields():
    nvml = fake_nvml(fail_power=True)
    reading = nvml_reading("GPU-1234", 3, nvml=nvml)
    assert reading.name == "NVIDIA H100 80GB HBM3" and reading.used_bytes == 2 * 2**30
    assert reading.utilization_pct == 93.0 and reading.power_w is None
    assert ("uuid", b"GPU-1234") in nvml.calls and "shutdown" in nvml.calls


def test_nvml_failing_to_initialise_gives_a_reason():
    reason = nvml_reading(None, 0, nvml=fake_nvml(fail_init=RuntimeError("Driver Not Loaded")))
    assert reason == "NVML readings unavailable: NVML failed to initialise (Driver Not Loaded)"


def test_nvml_missing_module_gives_a_reason(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    assert nvml_reading(None, 0) == "NVML readings unavailable: nvidia-ml-py is not installed"


def test_profile_on_fake_cuda_device_shows_nvml_and_syncs_each_step():
    dev = FakeCudaDevice()
    r = torchmagic.profile(lambda: torch.ones(4) + 1, steps=3, warmup=1, device=dev)
    assert dev.syncs == 2 * 4  # before and after each of 1 warm-up and 3 steps
    assert r.device["kind"] == "cuda" and r.nvml["name"] == "Fake H100"
    assert not any("CPU-only" in note for note in r.notes)
    assert "NVML after the profile: Fake H100: 600.0 MiB of 80.0 GiB used (all processes), 37% busy" in r.to_text()


def test_profile_notes_why_nvml_is_missing():
    dev = FakeCudaDevice(nvml="NVML readings unavailable: NVML failed to initialise (no driver)")
    r = torchmagic.profile(lambda: torch.ones(4), device=dev)
    assert r.nvml is None
    assert "NVML readings unavailable: NVML failed to initialise (no driver)" in r.to_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_profile_attributes_kernels_to_ops():
    model = torch.nn.Linear(1024, 1024).cuda()
    x = torch.randn(256, 1024, device="cuda")
    r = torchmagic.profile(lambda: model(x).sum().item(), steps=3, warmup=1)
    assert r.device["kind"] == "cuda"
    assert sum(op.self_device_us for op in r.ops) > 0
    assert r.device_categories_s
    assert any(span.lane.startswith("GPU stream") for span in r.timeline)
    assert r.finding("sync") is not None or r.finding("gpu_idle") is not None
