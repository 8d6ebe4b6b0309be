"""A fake CUDA device for testing the logic above the device layer on a machine without a GPU.

Its memory follows a known law (allocated bytes are whatever the test allocates through it) and
raises torch.OutOfMemoryError past its capacity, like the CUDA caching allocator.
"""

from __future__ import annotations

import contextlib
import time

import torch

from torchmagic.core.devices import AllocatorStats, Device, LowPrecision, NvmlReading
from torchmagic.core.devices.profiler import PeakReading


class FakeCudaDevice(Device):
    kind = "cuda"
    captures_cuda_graphs = has_tf32 = pinned_memory_helps = traces_kernels = True
    autocast_keeps = "softmax, norms and losses stay in fp32"

    def __init__(self, capacity_bytes: int = 80 * 2**30, nvml: NvmlReading | str | None = None,
                 name: str = "Fake H100", index: int = 0):
        super().__init__(index)
        self.context = True  # this process has a CUDA context there (False: a GPU it has not used)
        self._name = name
        self.capacity_bytes = capacity_bytes
        self.allocated = 0
        self.reserved = 0
        self.high_water = 0  # like the allocator's peak counter, for peak_scope
        self.syncs = 0
        self.energy_read_at: list[float] = []  # when energy_mj() was read, with watts set (perf_counter's seconds)
        self.cache_empties = 0
        self.ooms = 0
        self.samplers_closed = 0
        # Opt-in: an out-of-memory error leaves the blocks cached then unusable for larger tensors until
        # empty_cache (the real allocator's fragmentation, reduced to what it does to the room left)
        self.fragments_after_oom = False
        self.fragmented = 0
        self._nvml = nvml if nvml is not None else NvmlReading(
            name=name, total_bytes=capacity_bytes, used_bytes=600 * 2**20,
            utilization_pct=37.0, temperature_c=41.0, power_w=120.5)

    @property
    def name(self) -> str:
        return self._name

    @property
    def is_accelerator(self) -> bool:
        return True

    watts: float | None = None   # set: the device has NVML's energy counter, drawing this much all along

    def energy_mj(self) -> int | None:
        if self.watts is None:
            return None
        self.energy_read_at.append(time.perf_counter())
        return round(self.watts * self.energy_read_at[-1] * 1000)

    def synchronize(self) -> None:
        self.syncs += 1

    def allocate(self, nbytes: int) -> None:
        if self.allocated + nbytes > self.capacity_bytes - self.fragmented:
            self.ooms += 1
            if self.fragments_after_oom:
                self.fragmented = self.reserved - self.allocated
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {nbytes} bytes (fake device, "
                f"{self.capacity_bytes - self.allocated} bytes free)")
        self.allocated += nbytes
        self.reserved = max(self.reserved, self.allocated)
        self.high_water = max(self.high_water, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated = max(self.allocated - nbytes, 0)

    def memory_allocated(self) -> int:
        return self.allocated

    def has_context(self) -> bool:
        return self.context

    def allocator_stats(self) -> AllocatorStats:
        return AllocatorStats(self.allocated, self.reserved, self.high_water, self.reserved, 0, self.ooms, 0)

    def reset_peak_stats(self) -> bool:
        self.high_water = self.allocated
        return True

    def sampler(self):
        device = self

        class Sampler:
            note = None

            def read(self):
                reading = device.nvml()
                return (reading.used_bytes, reading.utilization_pct) if isinstance(reading, NvmlReading) else (None, None)

            def close(self):
                device.samplers_closed += 1

        return Sampler()

    def memory_reserved(self) -> int:
        return self.reserved

    def memory_capacity(self) -> tuple[int, int]:
        return self.capacity_bytes - self.reserved, self.capacity_bytes

    @contextlib.contextmanager
    def peak_scope(self):
        reading = PeakReading()
        start, self.high_water = self.allocated, self.allocated
        try:
            yield reading
        finally:
            reading.peak_bytes = self.high_water - start
            reading.net_bytes = self.allocated - start

    def empty_cache(self) -> None:
        self.cache_empties += 1
        self.reserved = self.allocated
        self.fragmented = 0

    def low_precision(self) -> LowPrecision:
        return LowPrecision(True, torch.bfloat16, "fake: bf16 tensor cores")

    def nvml(self):
        return self._nvml


class FastBf16Cpu(Device):
    """The real CPU, but declared to have (or lack) fast bf16, so the amp rule is testable anywhere."""

    kind = "cpu"
    runs_dynamic_int8 = True

    def __init__(self, fast: bool = True):
        super().__init__(None)
        self.fast = fast

    @property
    def label(self) -> str:
        return "cpu"

    def low_precision(self) -> LowPrecision:
        return LowPrecision(self.fast, torch.bfloat16, "declared by the test", "slower than")


# --- a fake pynvml module: NVML as a real driver answers ------------------------------------

class _NvmlStruct:
    """What pynvml returns for a C struct: its fields as attributes."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class FakeNvmlGpu:
    """One device as NVML knows it.  ``used`` is what processes hold (v2's used); ``reserved`` is
    the driver's own, which v1 folds into used.  Process lists are (host pid, bytes or None);
    ``compute_error``/``graphics_error`` name an NVML error class that the list raises."""

    def __init__(self, name: str, total: int, used: int, reserved: int = 0, mig: bool = False,
                 compute=(), graphics=(), compute_error: str | None = None, graphics_error: str | None = None,
                 energy_mj: int | None = None):
        self.name, self.total, self.used, self.reserved, self.mig = name, total, used, reserved, mig
        self.energy_mj = energy_mj  # None: the counter is not supported (before Volta, MIG slices)
        self.compute, self.graphics = list(compute), list(graphics)
        self.compute_error, self.graphics_error = compute_error, graphics_error


class FakePynvml:
    """Enough of pynvml for torchmagic.core.devices.nvml, keyed by the UUIDs NVML uses ("GPU-..." for
    a GPU, "MIG-..." for a MIG slice).  ``memory_v2``: "yes", "no-driver" (the driver lacks
    nvmlDeviceGetMemoryInfo_v2) or "no-bindings" (pynvml predates nvmlMemory_v2).
    ``processes_v3=False``: a driver older than the bindings' process struct."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        message = "Unknown Error"

        def __str__(self):
            return self.message

    class NVMLError_NotFound(NVMLError):
        message = "Not Found"

    class NVMLError_InvalidArgument(NVMLError):
        message = "Invalid Argument"

    class NVMLError_NotSupported(NVMLError):
        message = "Not Supported"

    class NVMLError_NoPermission(NVMLError):
        message = "Insufficient Permissions"

    class NVMLError_FunctionNotFound(NVMLError):
        message = "Function Not Found"

    class NVMLError_GpuIsLost(NVMLError):
        message = "GPU is lost"

    class NVMLLibraryMismatchError(Exception):
        pass

    def __init__(self, gpus: dict[str, FakeNvmlGpu], memory_v2: str = "yes", processes_v3: bool = True,
                 lookup_error: str | None = None):
        self.gpus, self.memory_v2, self.processes_v3, self.lookup_error = gpus, memory_v2, processes_v3, lookup_error
        self.calls: list = []
        if memory_v2 != "no-bindings":
            self.nvmlMemory_v2 = 0x02000028

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes):
        self.calls.append(("uuid", uuid.decode()))
        if self.lookup_error:
            raise getattr(self, self.lookup_error)()
        if uuid.decode() not in self.gpus:
            raise self.NVMLError_NotFound()
        return uuid.decode()

    def nvmlDeviceGetHandleByIndex(self, index: int):
        return list(self.gpus)[index]

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self.calls.append(("memory", version))
        gpu = self.gpus[handle]
        if version is None:  # v1: the driver's reserve counted as used
            used = gpu.used + gpu.reserved
            return _NvmlStruct(total=gpu.total, free=gpu.total - used, used=used)
        if self.memory_v2 != "yes":
            raise self.NVMLError_FunctionNotFound()
        return _NvmlStruct(version=version, total=gpu.total, reserved=gpu.reserved,
                                     free=gpu.total - gpu.reserved - gpu.used, used=gpu.used)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if self.gpus[handle].energy_mj is None:
            raise self.NVMLError_NotSupported()
        return self.gpus[handle].energy_mj

    def nvmlDeviceGetName(self, handle):
        return self.gpus[handle].name.encode()

    def nvmlDeviceIsMigDeviceHandle(self, device):
        return int(self.gpus[device].mig)

    def nvmlDeviceGetUtilizationRates(self, handle):
        if self.gpus[handle].mig:
            raise self.NVMLError_NotSupported()
        return _NvmlStruct(gpu=50, memory=20)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        if self.gpus[handle].mig:
            raise self.NVMLError_NotSupported()
        return 40

    def nvmlDeviceGetPowerUsage(self, handle):
        if self.gpus[handle].mig:
            raise self.NVMLError_NotSupported()
        return 300_000

    def _processes(self, handle, kind: str, struct_v3: bool):
        gpu = self.gpus[handle]
        if struct_v3 and not self.processes_v3:  # what pynvml's unversioned call raises then
            raise self.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")
        error = getattr(gpu, f"{kind}_error")
        if error:
            raise getattr(self, error)()
        return [_NvmlStruct(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, used in getattr(gpu, kind)]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._processes(handle, "compute", True)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle):
        return self._processes(handle, "compute", False)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return self._processes(handle, "graphics", True)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle):
        return self._processes(handle, "graphics", False)


class FakeGraphCudaDevice(FakeCudaDevice):
    """A FakeCudaDevice with CUDA graph pools, as the caching allocator keeps them: a pool is
    reserved when its graphs are recorded (``record_pool``), counts in reserved memory while its
    owner lives, and goes back to the device at the first empty_cache after ``release_pool``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pools: dict[int, int] = {}  # owner id -> bytes reserved for its graphs
        self.released_pools: set[int] = set()

    def record_pool(self, owner: int, nbytes: int) -> None:
        self.pools[owner] = self.pools.get(owner, 0) + nbytes

    def release_pool(self, owner: int) -> None:
        self.released_pools.add(owner)

    def graph_pool_bytes(self) -> int:
        return sum(self.pools.values())

    def memory_reserved(self) -> int:
        return super().memory_reserved() + self.graph_pool_bytes()

    def empty_cache(self) -> None:
        super().empty_cache()
        for owner in self.released_pools:
            self.pools.pop(owner, None)
        self.released_pools.clear()


class DisguisedOomCudaDevice(FakeCudaDevice):
    """Runs out of memory the way cuBLAS, cuDNN or the driver report it: a RuntimeError whose
    message names the status, not torch.OutOfMemoryError."""

    def __init__(self, message: str, capacity_bytes: int = 80 * 2**30, error: type[RuntimeError] = RuntimeError):
        super().__init__(capacity_bytes)
        self.message, self.error = message, error

    def allocate(self, nbytes: int) -> None:
        try:
            super().allocate(nbytes)
        except torch.OutOfMemoryError:
            raise self.error(self.message) from None
