"""NVML as it really is: MIG slices, containers' host PIDs, process lists that fail apart, v2 memory info."""

import os

import pytest

from torchmagic.core.devices import nvml_reading
from torchmagic.core.devices.nvml import NvmlSampler
from torchmagic.features.memory import report as memory_engine
from torchmagic.features.memory.report import memory_report

from ..fakes import FakeCudaDevice, FakeNvmlGpu, FakePynvml

GiB, MiB = 2**30, 2**20
MIG_UUID = "c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
HOST_PID, OTHER_HOST_PID = 5_000_001, 5_000_002  # above Linux's largest pid_max (2**22): no such PID here


def h100_with_a_mig_slice(**slice_fields):
    return FakePynvml({
        "GPU-aaaa": FakeNvmlGpu("NVIDIA H100 80GB HBM3", 80 * GiB, 3 * GiB, reserved=512 * MiB),
        f"MIG-{MIG_UUID}": FakeNvmlGpu("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40 * GiB, 6 * GiB, mig=True,
                                       **slice_fields),
    })


# --- 1. MIG slices -------------------------------------------------------------------------

@pytest.mark.parametrize("uuid", [f"GPU-{MIG_UUID}", MIG_UUID, f"MIG-{MIG_UUID}"])
def test_a_mig_slice_is_found_by_its_mig_uuid_whatever_prefix_cuda_gave(uuid):
    nvml = h100_with_a_mig_slice()
    reading = nvml_reading(uuid, 0, nvml=nvml)
    assert reading.name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb" and reading.mig
    assert (reading.total_bytes, reading.used_bytes) == (40 * GiB, 6 * GiB)  # the slice's, not the GPU's
    assert reading.utilization_pct is None and reading.temperature_c is None
    assert ("uuid", f"MIG-{MIG_UUID}") in nvml.calls and nvml.calls[-1] == "shutdown"


def test_the_sampler_uses_the_same_lookup():
    sampler = NvmlSampler(f"GPU-{MIG_UUID}", 0, nvml=h100_with_a_mig_slice())
    assert sampler.note is None and sampler.read() == (6 * GiB, None)
    sampler.close()


def test_a_uuid_nvml_does_not_know_and_a_lookup_that_fails_otherwise():
    reason = nvml_reading("GPU-zzzz", 0, nvml=h100_with_a_mig_slice())
    assert reason == "NVML readings unavailable: no device with UUID GPU-zzzz or MIG-zzzz (Not Found)"
    denied = FakePynvml(h100_with_a_mig_slice().gpus, lookup_error="NVMLError_NoPermission")
    assert nvml_reading("GPU-aaaa", 0, nvml=denied) == "NVML readings unavailable: Insufficient Permissions"
    assert [c for c in denied.calls if c[0] == "uuid"] == [("uuid", "GPU-aaaa")]  # not retried as MIG-, not hidden
    assert "Insufficient Permissions" in NvmlSampler("GPU-aaaa", 0, nvml=denied).note


def test_a_device_failing_mid_reading_gives_a_reason_not_an_exception():
    nvml = h100_with_a_mig_slice()
    nvml.nvmlDeviceGetName = lambda handle: (_ for _ in ()).throw(nvml.NVMLError_GpuIsLost())
    assert nvml_reading("GPU-aaaa", 0, nvml=nvml) == "NVML readings unavailable: GPU is lost"
    assert nvml.calls[-1] == "shutdown"


# --- 3. compute and graphics lists read apart ------------------------------------------------

def processes_of(**gpu_fields):
    gpu = FakeNvmlGpu("NVIDIA A100", 40 * GiB, 10 * GiB, **gpu_fields)
    reading = nvml_reading("GPU-a", 0, nvml=FakePynvml({"GPU-a": gpu}))
    return reading.processes and [(p.pid, p.used_bytes) for p in reading.processes], reading.processes_note


def test_graphics_not_supported_keeps_the_compute_list_silently():
    assert processes_of(compute=[(11, GiB)], graphics_error="NVMLError_NotSupported") == ([(11, GiB)], None)


def test_graphics_denied_keeps_the_compute_list_and_says_what_is_missing():
    found, note = processes_of(compute=[(11, GiB)], graphics_error="NVMLError_NoPermission")
    assert found == [(11, GiB)]
    assert note == "NVML's graphics process list is not visible here (Insufficient Permissions)"


def test_without_the_compute_list_there_is_no_list():
    found, note = processes_of(compute_error="NVMLError_NoPermission", graphics=[(11, GiB)])
    assert found is None and note == "NVML's process list is not visible here (Insufficient Permissions)"


def test_a_process_in_both_lists_counts_once_with_the_figure_known():
    found, _ = processes_of(compute=[(11, None), (12, GiB), (13, 2 * GiB)],
                            graphics=[(11, 3 * GiB), (12, None), (13, 2**64 - 1)])  # 2**64-1: NVML's "not available"
    assert found == [(11, 3 * GiB), (12, GiB), (13, 2 * GiB)]


def test_a_driver_older_than_the_bindings_gets_the_v2_process_lists():
    gpu = FakeNvmlGpu("NVIDIA V100", 16 * GiB, GiB, compute=[(11, GiB)])
    reading = nvml_reading("GPU-v", 0, nvml=FakePynvml({"GPU-v": gpu}, processes_v3=False))
    assert [(p.pid, p.used_bytes) for p in reading.processes] == [(11, GiB)]


# --- 4. v2 memory info: the driver's reserve apart -------------------------------------------

@pytest.mark.parametrize("memory_v2, driver_reserved", [("yes", 512 * MiB), ("no-driver", None), ("no-bindings", None)])
def test_driver_reserved_memory_is_told_apart_where_v2_exists(memory_v2, driver_reserved):
    nvml = FakePynvml(h100_with_a_mig_slice().gpus, memory_v2=memory_v2)
    reading = nvml_reading("GPU-aaaa", 0, nvml=nvml)
    assert reading.used_bytes == 3 * GiB + 512 * MiB  # the same meaning either way: free = total - used
    assert reading.driver_reserved_bytes == driver_reserved
    asked = [c[1] for c in nvml.calls if c[0] == "memory"]
    assert asked == {"yes": [0x02000028], "no-driver": [0x02000028, None], "no-bindings": [None]}[memory_v2]


def test_the_sampler_stops_asking_for_v2_once_the_driver_lacks_it():
    nvml = FakePynvml(h100_with_a_mig_slice().gpus, memory_v2="no-driver")
    sampler = NvmlSampler("GPU-aaaa", 0, nvml=nvml)
    assert [sampler.read() for _ in range(3)] == [(3 * GiB + 512 * MiB, 50.0)] * 3
    assert [c[1] for c in nvml.calls if c[0] == "memory"] == [0x02000028, None, None, None]
    sampler.close()


def test_driver_reserved_memory_is_blamed_on_no_process():
    gpu = FakeNvmlGpu("NVIDIA H100", 80 * GiB, 9 * GiB, reserved=GiB, compute=[(os.getpid(), 7 * GiB), (4242, 2 * GiB)])
    dev = FakeCudaDevice(nvml=nvml_reading("GPU-h", 0, nvml=FakePynvml({"GPU-h": gpu})))
    dev.allocate(5 * GiB)
    d = memory_report({}, devices=[dev]).devices[0]
    assert (d.used_bytes, d.driver_reserved_bytes, d.gap_bytes) == (10 * GiB, GiB, 5 * GiB)
    assert ("NVML used − torch reserved = 5.0 GiB: driver-reserved 1.0 GiB; this process's CUDA context, libraries "
            "and memory outside torch's allocator 2.0 GiB; 1 other process 2.0 GiB (pid 4242 2.0 GiB)") in d.notes


# --- 2. containers: NVML lists host PIDs ----------------------------------------------------

def container_report(monkeypatch, compute, reserved=5 * GiB, contained=True, context=False):
    monkeypatch.setattr(memory_engine, "_in_pid_namespace", lambda: contained)
    gpu = FakeNvmlGpu("NVIDIA H100", 80 * GiB, 12 * GiB, compute=compute)
    dev = FakeCudaDevice(nvml=nvml_reading("GPU-h", 0, nvml=FakePynvml({"GPU-h": gpu})))
    dev.context = context
    if reserved:
        dev.allocate(reserved)
    d = memory_report({}, devices=[dev]).devices[0]
    return d, d.notes[-1]


def test_in_a_container_this_process_is_found_by_its_host_pid(monkeypatch):
    d, note = container_report(monkeypatch, [(HOST_PID, 7 * GiB), (OTHER_HOST_PID, 2 * GiB)])
    assert d.this_process_bytes == 7 * GiB and d.other_processes == [(OTHER_HOST_PID, 2 * GiB)]
    assert f"outside torch's allocator 2.0 GiB (pid {HOST_PID} on the host, where NVML counts)" in note


def test_in_a_container_a_host_pid_that_cannot_be_told_apart_is_counted_nowhere(monkeypatch):
    d, note = container_report(monkeypatch, [(HOST_PID, 7 * GiB), (OTHER_HOST_PID, 5 * GiB), (1, GiB)])
    assert d.this_process_bytes is None and d.other_processes == [(1, GiB)]  # pid 1 exists here: another process
    assert (f"NVML lists host PIDs and cannot tell which of 2 processes (pid {HOST_PID} 7.0 GiB, pid {OTHER_HOST_PID} "
            "5.0 GiB) is this process: counted neither as this process nor as others") in note
    assert "NVML does not list this process" not in note


def test_in_a_container_our_own_pid_number_can_be_another_host_process(monkeypatch):
    d, note = container_report(monkeypatch, [(os.getpid(), GiB), (HOST_PID, 7 * GiB)])  # 1 GiB < 5 GiB reserved here
    assert d.this_process_bytes == 7 * GiB and d.other_processes == [(os.getpid(), GiB)]


@pytest.mark.parametrize("contained", [True, False])
def test_our_own_pid_listed_with_nothing_is_this_process_without_its_memory(monkeypatch, contained):
    d, note = container_report(monkeypatch, [(os.getpid(), 0), (OTHER_HOST_PID, 2 * GiB)], contained=contained)
    assert d.this_process_bytes is None and d.other_processes == [(OTHER_HOST_PID, 2 * GiB)]
    assert "NVML lists this process without its memory" in note and "2 other processes" not in note


def test_outside_a_container_an_unlisted_process_is_said_so(monkeypatch):
    d, note = container_report(monkeypatch, [(HOST_PID, 7 * GiB)], contained=False)
    assert d.this_process_bytes is None and d.other_processes == [(HOST_PID, 7 * GiB)]
    assert "NVML does not list this process, so its CUDA context is in the rest" in note


def test_with_nothing_reserved_a_host_pid_is_not_claimed(monkeypatch):
    d, note = container_report(monkeypatch, [(HOST_PID, 500 * MiB)], reserved=0, context=True)  # nothing allocated
    assert d.this_process_bytes is None and d.other_processes == []
    assert f"cannot tell whether pid {HOST_PID} 500.0 MiB is this process" in note


def test_a_process_without_cuda_claims_nothing(monkeypatch):
    d, note = container_report(monkeypatch, [(HOST_PID, 7 * GiB)], reserved=0)
    assert d.this_process_bytes is None and d.other_processes == [(HOST_PID, 7 * GiB)]
    assert "this process" not in note


def test_pid_namespace_and_pid_checks_read_the_real_system():
    assert memory_engine._pid_exists_here(os.getpid()) and memory_engine._pid_exists_here(1)
    assert not memory_engine._pid_exists_here(HOST_PID) and not memory_engine._pid_exists_here(0)
    expected = os.stat("/proc/self/ns/pid").st_ino != 0xEFFFFFFC if os.path.exists("/proc/self/ns/pid") else None
    assert memory_engine._in_pid_namespace() is expected
