"""A fake CUDA device for testing the logic above the device layer on a machine without a GPU.

Its memory follows a known law (allocated bytes are whatever the test allocates through it) and
raises torch.OutOfMemoryError past its capacity, like the CUDA caching allocator.
"""

from __future__ import annotations

import contextlib

import torch

from torchmagic.devices import AllocatorStats, Device, LowPrecision, NvmlReading
from torchmagic.devices.profiler import PeakReading


class FakeCudaDevice(Device):
    kind = "cuda"

    def __init__(self, capacity_bytes: int = 80 * 2**30, nvml: NvmlReading | str | None = None,
                 name: str = "Fake H100"):
        super().__init__(0)
        self._name = name
        self.capacity_bytes = capacity_bytes
        self.allocated = 0
        self.reserved = 0
        self.high_water = 0  # like the allocator's peak counter, for peak_scope
        self.syncs = 0
        self.cache_empties = 0
        self.ooms = 0
        self.samplers_closed = 0
        self._nvml = nvml if nvml is not None else NvmlReading(
            name=name, total_bytes=capacity_bytes, used_bytes=600 * 2**20,
            utilization_pct=37.0, temperature_c=41.0, power_w=120.5)

    @property
    def name(self) -> str:
        return self._name

    @property
    def is_accelerator(self) -> bool:
        return True


    def synchronize(self) -> None:
        self.syncs += 1

    def allocate(self, nbytes: int) -> None:
        if self.allocated + nbytes > self.capacity_bytes:
            self.ooms += 1
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

    def low_precision(self) -> LowPrecision:
        return LowPrecision(True, torch.bfloat16, "fake: bf16 tensor cores")

    def nvml(self):
        return self._nvml


class FastBf16Cpu(Device):
    """The real CPU, but declared to have (or lack) fast bf16, so the amp rule is testable anywhere."""

    kind = "cpu"

    def __init__(self, fast: bool = True):
        super().__init__(None)
        self.fast = fast

    @property
    def label(self) -> str:
        return "cpu"

    def low_precision(self) -> LowPrecision:
        return LowPrecision(self.fast, torch.bfloat16, "declared by the test")
