"""The CUDA device.  Kept thin: each method is one torch call, so the logic
above runs unchanged against the fake device the tests inject.

A CudaDevice may describe a GPU this process has not used (``%gpumem`` lists every visible
GPU): until CUDA is initialised, it reads only what needs no CUDA context (NVML, and torch's
allocator counters, which are zero then), so looking never creates one.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from .base import AllocatorStats, Device, LowPrecision
from .history import cuda_allocation_history
from .info import DeviceInfo
from .nvml import NvmlReading, NvmlSampler, energy_mj, nvml_reading
from .profiler import allocation_peak


class CudaDevice(Device):
    kind = "cuda"
    captures_cuda_graphs = True
    has_tf32 = True  # Ampere and newer; on older GPUs allowing it changes nothing
    pinned_memory_helps = True
    traces_kernels = True
    autocast_keeps = "softmax, norms and losses stay in fp32"

    def __init__(self, index: int | None = None):
        super().__init__(torch.cuda.current_device() if index is None else index)

    @property
    def name(self) -> str:
        if torch.cuda.is_initialized():
            return torch.cuda.get_device_name(self.index)
        reading = self.nvml()
        return reading.name if isinstance(reading, NvmlReading) else f"CUDA device {self.index}"

    @property
    def is_accelerator(self) -> bool:
        return True

    @property
    def autotunes_per_shape(self) -> bool:
        return torch.backends.cudnn.benchmark

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)

    def profiler_activities(self) -> list:
        act = torch.profiler.ProfilerActivity
        return [act.CPU, act.CUDA]

    def memory_allocated(self) -> int | None:
        return torch.cuda.memory_allocated(self.index)

    def memory_reserved(self) -> int | None:
        return torch.cuda.memory_reserved(self.index)

    def has_context(self) -> bool:
        if not torch.cuda.is_initialized():
            return False
        has_primary = getattr(torch._C, "_cuda_hasPrimaryContext", None)  # CUDA builds: per device, creates none
        return has_primary(self.index) if has_primary is not None else True

    def graph_pool_bytes(self) -> int:
        if not torch.cuda.is_initialized():
            return 0
        try:
            segments = torch.cuda.memory_snapshot(include_traces=False)  # no stacks: cheap (torch 2.11+)
        except TypeError:  # torch before 2.11 takes no argument
            segments = torch.cuda.memory_snapshot()
        # (0, 0) is the ordinary pool
        return sum(s["total_size"] for s in segments
                   if s["device"] == self.index and tuple(s["segment_pool_id"]) != (0, 0))

    def memory_capacity(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(self.index)  # free counts other processes' use
        return int(free), int(total)

    def allocator_stats(self) -> AllocatorStats:
        stats = torch.cuda.memory_stats(self.index) if torch.cuda.is_initialized() else {}
        return AllocatorStats(
            allocated_bytes=stats.get("allocated_bytes.all.current", 0),
            reserved_bytes=stats.get("reserved_bytes.all.current", 0),
            peak_allocated_bytes=stats.get("allocated_bytes.all.peak", 0),
            peak_reserved_bytes=stats.get("reserved_bytes.all.peak", 0),
            inactive_split_bytes=stats.get("inactive_split_bytes.all.current", 0),
            num_ooms=stats.get("num_ooms", 0),
            num_alloc_retries=stats.get("num_alloc_retries", 0),
        )

    def reset_peak_stats(self) -> bool:
        if not torch.cuda.is_initialized():
            return False  # nothing allocated, nothing to reset
        torch.cuda.reset_peak_memory_stats(self.index)
        return True

    def sampler(self) -> NvmlSampler:
        return NvmlSampler(self.uuid(), _nvml_index(self.index))

    def peak_scope(self):
        return _allocation_and_reserved_peak(self.index)

    def allocation_history(self):
        return cuda_allocation_history()

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def rng_state(self):
        return torch.get_rng_state(), torch.cuda.get_rng_state(self.index)

    def set_rng_state(self, state) -> None:
        torch.set_rng_state(state[0])
        torch.cuda.set_rng_state(state[1], self.index)

    def uuid(self) -> str | None:
        """The device UUID, which NVML also knows: the one safe key under CUDA_VISIBLE_DEVICES.
        None before CUDA is initialised (reading it would initialise CUDA)."""
        if not torch.cuda.is_initialized():
            return None
        uuid = getattr(torch.cuda.get_device_properties(self.index), "uuid", None)
        return None if uuid is None else f"GPU-{uuid}"

    def low_precision(self) -> LowPrecision:
        return tensor_core_precision(*torch.cuda.get_device_capability(self.index))

    def nvml(self):
        return nvml_reading(self.uuid(), _nvml_index(self.index))

    def energy_mj(self) -> int | None:
        return energy_mj(self.uuid(), _nvml_index(self.index))

    def describe(self) -> DeviceInfo:
        return replace(super().describe(), uuid=self.uuid())


class _allocation_and_reserved_peak(allocation_peak):
    """torch's allocations on one GPU (``peak_bytes``) and, as the footprint, the growth of what the
    caching allocator reserved from the GPU: rounded blocks and fragmentation included.  Within a
    scope the cache only grows, unless an allocation failed and it was emptied to retry: then the
    growth is a lower bound."""

    __slots__ = ("_reserved",)

    def __init__(self, index: int):
        super().__init__(torch.autograd.DeviceType.CUDA, index)

    def acquire(self):
        self._reserved = torch.cuda.memory_reserved(self._index)
        return super().acquire()

    def release(self) -> None:
        super().release()
        self._reading.footprint_bytes = max(torch.cuda.memory_reserved(self._index) - self._reserved, 0)


def tensor_core_precision(major: int, minor: int) -> LowPrecision:
    """The 16-bit type a GPU of this compute capability runs fast: bf16 from Ampere (8.0) on."""
    capability = f"compute capability {major}.{minor}"
    if major >= 8:
        return LowPrecision(True, torch.bfloat16, f"{capability}: bf16 tensor cores")
    if major >= 7:
        return LowPrecision(True, torch.float16, f"{capability}: fp16 tensor cores; bf16 ones came with Ampere")
    return LowPrecision(False, torch.float16, f"{capability}: no tensor cores")


def _nvml_index(index: int) -> int:
    """NVML's index of CUDA device ``index``, for when no UUID can be read: CUDA_VISIBLE_DEVICES
    renumbers CUDA's devices but not NVML's (a list of indices maps through; PCI order assumed)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return index
    entries = [e.strip() for e in visible.split(",")]
    try:
        return int(entries[index])
    except (IndexError, ValueError):  # UUIDs or MIG names: the index is all we have
        return index
