"""The device layer: OOM classification, NVML access, device injection, the fake CUDA device."""

import os
import threading
import time
import types

import pytest
import torch

import torchmagic
from torchmagic.core.devices import CpuDevice, choose_device, is_out_of_memory, nvml_reading, use_device

from ..fakes import FakeCudaDevice


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
        assert choose_device() is outer
        with use_device(inner):
            assert choose_device() is inner
        assert choose_device() is outer
    assert choose_device().kind in ("cpu", "cuda", "mps")


def test_cpu_device_reports_low_precision_and_note():
    dev = CpuDevice()
    lp = dev.low_precision()
    assert isinstance(lp.fast, bool) and lp.reason
    if torch.cuda.is_available():  # a CPU profile on a GPU machine is a choice, not a limitation
        assert dev.profile_note() is None
    else:
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
    assert r.device.kind == "cuda" and r.nvml["name"] == "Fake H100"
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
    assert r.device.kind == "cuda"
    assert sum(op.self_device_us for op in r.ops) > 0
    assert r.device_categories_s
    assert any(span.lane.startswith("GPU stream") for span in r.timeline)
    assert r.finding("sync") is not None or r.finding("gpu_idle") is not None


class NvmlError(Exception):
    pass


def fleet_nvml(process_error=None):
    """Two GPUs as NVML numbers them, by UUID; the second is a MIG slice."""
    gpus = {
        "GPU-a": dict(index=0, name=b"NVIDIA A100", used=1 * 2**30, mig=False,
                      compute=[types.SimpleNamespace(pid=10, usedGpuMemory=2**30)], graphics=[]),
        "MIG-b": dict(index=1, name=b"NVIDIA H100 MIG 3g.40gb", used=5 * 2**30, mig=True,
                      compute=[types.SimpleNamespace(pid=20, usedGpuMemory=None),
                               types.SimpleNamespace(pid=21, usedGpuMemory=3 * 2**30)],
                      graphics=[types.SimpleNamespace(pid=21, usedGpuMemory=3 * 2**30)]),
    }
    by_index = {g["index"]: uuid for uuid, g in gpus.items()}
    calls = []

    def processes(kind):
        def read(handle):
            if process_error:
                raise process_error
            return gpus[handle][kind]
        return read

    def utilization(handle):
        if gpus[handle]["mig"]:
            raise NvmlError("Not Supported")
        return types.SimpleNamespace(gpu=50)

    def by_uuid(uuid):
        uuid = uuid.decode()
        if uuid not in gpus:
            raise NvmlError("Not Found")
        return uuid

    return FakeNvml(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByUUID=by_uuid, nvmlDeviceGetHandleByIndex=lambda i: by_index[i],
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=40 * 2**30, used=gpus[h]["used"]),
        nvmlDeviceGetName=lambda h: gpus[h]["name"], nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetTemperature=lambda h, kind: 40, nvmlDeviceGetPowerUsage=lambda h: 100_000,
        nvmlDeviceGetComputeRunningProcesses=processes("compute"),
        nvmlDeviceGetGraphicsRunningProcesses=processes("graphics"),
        nvmlDeviceIsMigDeviceHandle=lambda h: gpus[h]["mig"], calls=calls)


def test_cuda_visible_devices_renumbering_is_resolved_by_uuid():
    # CUDA_VISIBLE_DEVICES=1: torch's cuda:0 is NVML's device 1; the UUID finds the right one
    reading = nvml_reading("MIG-b", 0, nvml=fleet_nvml())
    assert reading.name == "NVIDIA H100 MIG 3g.40gb" and reading.used_bytes == 5 * 2**30
    assert nvml_reading(None, 0, nvml=fleet_nvml()).name == "NVIDIA A100"  # no UUID: the index is all there is


def test_nvml_processes_and_mig():
    reading = nvml_reading("MIG-b", 0, nvml=fleet_nvml())
    assert reading.mig and reading.utilization_pct is None  # not reported per MIG slice
    assert [(p.pid, p.used_bytes) for p in reading.processes] == [(20, None), (21, 3 * 2**30)]  # 21 listed once
    denied = nvml_reading("GPU-a", 0, nvml=fleet_nvml(process_error=NvmlError("Insufficient Permissions")))
    assert denied.processes is None and "Insufficient Permissions" in denied.processes_note
    assert denied.used_bytes == 2**30 and denied.utilization_pct == 50.0  # the rest is still read


def test_nvml_sampler_initialises_once_and_explains_failures():
    from torchmagic.core.devices.nvml import NvmlSampler

    nvml = fleet_nvml()
    sampler = NvmlSampler("GPU-a", 0, nvml=nvml)
    assert [sampler.read() for _ in range(3)] == [(2**30, 50.0)] * 3
    sampler.close()
    assert nvml.calls == ["init", "shutdown"] and sampler.read() == (None, None)
    unknown = NvmlSampler("GPU-zzz", 0, nvml=fleet_nvml())
    assert "does not know this device" in unknown.note and unknown.read() == (None, None)
    broken = fake_nvml(fail_init=NvmlError("Driver Not Loaded"))
    assert "failed to initialise (Driver Not Loaded)" in NvmlSampler("GPU-a", 0, nvml=broken).note


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpumem_on_a_real_gpu():
    from torchmagic.features.memory.report import memory_report
    from torchmagic.features.memory.run import run_cell_memory

    weights = torch.zeros(64 * 2**20, device="cuda")  # 256 MiB
    r = memory_report({"weights": weights})
    d = r.devices[0]
    assert d.label == "cuda:0" and d.allocated_bytes >= 256 * 2**20 and d.reserved_bytes >= d.allocated_bytes
    assert r.variables[0].name == "weights" and r.variables[0].device == "cuda:0"
    assert r.variables[0].bytes == 256 * 2**20
    ns = {}
    run = run_cell_memory(lambda: ns.update(out=torch.ones(32 * 2**20, device="cuda")), ns)
    assert abs(run.result.cell.net_bytes - 128 * 2**20) <= 0.01 * 128 * 2**20
    assert [v.name for v in run.result.cell.new_variables] == ["out"]


# Messages as torch 2.x raises them: TORCH_CUDABLAS_CHECK ("CUDA error: <status> when calling `<call>`"),
# cuDNN's "cuDNN error: <status>", C10_CUDA_CHECK ("CUDA error: <cudaGetErrorString>") as AcceleratorError.
# torch 2.8+ raises the driver's own errors as AcceleratorError (a RuntimeError); earlier torch as RuntimeError
AcceleratorError = getattr(torch, "AcceleratorError", RuntimeError)
_CUDA_HINT = "\nCUDA kernel errors might be asynchronously reported at some other API call"


@pytest.mark.parametrize("exc", [
    RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"),
    RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasLtCreate(handle)`"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, "
                 "&alpha, a, lda, b, ldb, &beta, c, ldc)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"),
    RuntimeError("cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`"),
    AcceleratorError("CUDA error: out of memory" + _CUDA_HINT),
    RuntimeError("HIP error: out of memory"),
    MemoryError(),
], ids=lambda exc: str(exc).split("\n")[0][:60] or type(exc).__name__)
def test_disguised_out_of_memory_is_recognised(exc):
    assert is_out_of_memory(exc)


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x3 and 4x5)"),
    RuntimeError("cuDNN error: CUDNN_STATUS_BAD_PARAM"),
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
                 "non-contiguous input."),
    AcceleratorError("CUDA error: an illegal memory access was encountered" + _CUDA_HINT),
    AcceleratorError("CUDA error: device-side assert triggered" + _CUDA_HINT),
    RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, "
                 "k, &alpha, a, lda, b, ldb, &beta, c, ldc)`"),
    RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasSetStream(handle, stream)`"),
    RuntimeError("CUDA error: CUBLAS_STATUS_INVALID_VALUE when calling `cublasGemmEx(...)`"),
    KeyError("CUBLAS_STATUS_ALLOC_FAILED"),  # not an error torch raises
], ids=lambda exc: str(exc).split("\n")[0][:60])
def test_real_errors_are_not_out_of_memory(exc):
    assert not is_out_of_memory(exc)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_cpu_footprint_scope_reads_the_process_s_resident_memory():
    """torch's allocations are the peak; everything the step takes from RAM is the footprint, read
    without the profiler: written Python buffers, which torch never sees, too.  The sampling
    thread ends with the scope."""
    threads = set(threading.enumerate())
    device = CpuDevice()
    with device.peak_scope() as tensor:
        x = torch.ones(48 * 2**20 // 4)  # 48 MiB, written
        del x
    with device.footprint_scope() as tensor_footprint:
        x = torch.ones(48 * 2**20 // 4)
        time.sleep(0.1)  # held long enough for the sampler to see it on a busy machine (unless it set a new VmHWM)
        del x
    with device.footprint_scope() as python:
        buffer = bytearray(b"\1") * (48 * 2**20)  # 48 MiB torch never sees
        time.sleep(0.1)
        del buffer
    assert tensor.peak_bytes == 48 * 2**20 and tensor.footprint_bytes is None
    assert tensor_footprint.footprint_bytes >= 46 * 2**20 and python.footprint_bytes >= 46 * 2**20
    assert set(threading.enumerate()) == threads
    assert FakeCudaDevice().footprint_scope() is None  # CUDA reads its footprint in peak_scope


def test_kinetos_chatter_is_recognised_in_a_rank_too():
    from torchmagic.core.devices.profiler import is_profiler_banner

    warning = ("[W1124 03:58:12.123456 31313 profiler_kineto.cpp:133] Memory block of unknown size was allocated "
               "before the profiling started, profiler results will not include the deallocation event")
    assert is_profiler_banner(warning) and is_profiler_banner("[rank0]:" + warning)
    assert is_profiler_banner("USDT: 12345.678] profiler_start")
    assert not is_profiler_banner("[W1124 12:00:00 x.cpp:1] something else the user should see")
    assert not is_profiler_banner("[rank0]: Traceback (most recent call last):")


def test_nvmls_energy_counter_is_read_or_none_where_the_driver_has_none():
    from torchmagic.core.devices.nvml import energy_mj

    from ..fakes import FakeNvmlGpu, FakePynvml

    nvml = FakePynvml({"GPU-a": FakeNvmlGpu("H100", 80 * 2**30, 0, energy_mj=123_456),
                       "MIG-b": FakeNvmlGpu("H100 MIG", 10 * 2**30, 0, mig=True)})
    assert energy_mj("GPU-a", None, nvml=nvml) == 123_456
    assert energy_mj("MIG-b", None, nvml=nvml) is None  # NotSupported
    assert energy_mj("GPU-missing", None, nvml=nvml) is None
    assert nvml.calls.count("init") == nvml.calls.count("shutdown") == 3


def test_a_gpus_datasheet_is_found_by_its_name_and_only_then():
    from torchmagic.core.devices.datasheets import datasheet

    names = {"NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe", "NVIDIA H200": "H200 SXM",
             "NVIDIA A100-SXM4-80GB": "A100 80GB SXM", "NVIDIA A100 80GB PCIe": "A100 80GB PCIe",
             "NVIDIA A100-SXM4-40GB": "A100 40GB", "NVIDIA L4": "L4", "Tesla T4": "T4",
             "Tesla V100-SXM2-32GB": "V100 SXM2", "NVIDIA L40S": None, "NVIDIA GeForce RTX 4090": None}
    for name, sheet in names.items():
        found = datasheet(name)
        assert (found.name if found else None) == sheet, name
    h100 = datasheet("NVIDIA H100 80GB HBM3")
    assert h100.flops_per_s["bfloat16"] == 989e12 and h100.bytes_per_s == 3.35e12


def test_graph_pool_bytes_on_a_torch_whose_memory_snapshot_takes_no_argument(monkeypatch):
    """torch before 2.11: memory_snapshot() has no include_traces (a TypeError for compile:reduce-overhead)."""
    import torch

    from torchmagic.core.devices import CudaDevice

    segments = [{"device": 0, "total_size": 4096, "segment_pool_id": (1, 2)},
                {"device": 0, "total_size": 999, "segment_pool_id": (0, 0)}]

    def snapshot_before_2_11():  # no keyword: as torch 2.4-2.10 define it
        return segments

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", snapshot_before_2_11)
    assert CudaDevice(0).graph_pool_bytes() == 4096


SETTLE_CHECK = """
import ctypes
from torchmagic.core.devices import CpuDevice
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
mallinfo2 = libc.mallinfo2
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
mallinfo2.restype = Info
def mmapped(size):
    before = mallinfo2().hblkhd
    block = libc.malloc(size)
    grown = mallinfo2().hblkhd - before
    libc.free(block)
    return grown >= size
print(mmapped(8 << 20))  # a fresh process: mmapped (and freeing it raises the threshold to 8 MiB only)
CpuDevice().settle_allocator()
print(mmapped(28 << 20))  # over 8 MiB, so mmapped unless settled
"""


def test_settling_the_allocator_serves_blocks_under_32_mib_from_the_heap_for_good():
    """In a fresh process glibc mmaps an 8 MiB block (fresh pages, faulted on each use); after settle_allocator a
    28 MiB one is not: where a step's blocks come from no longer depends on what was freed last."""
    import ctypes
    import subprocess
    import sys

    try:
        ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        pytest.skip("needs glibc 2.33+ (mallinfo2)")
    shown = subprocess.run([sys.executable, "-c", SETTLE_CHECK], capture_output=True, text=True, check=True).stdout
    assert shown.split() == ["True", "False"]
