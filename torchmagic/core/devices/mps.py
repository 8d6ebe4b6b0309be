"""The Apple GPU (MPS) device.  Kept thin: each method is one torch call; peaks are read from the
profiler's allocation events, as on the CPU."""

from __future__ import annotations

import torch

from .base import Device, LowPrecision
from .profiler import allocation_peak


class MpsDevice(Device):
    kind = "mps"
    autocast_keeps = "losses in fp32"

    @property
    def name(self) -> str:
        return "Apple GPU (MPS)"

    @property
    def label(self) -> str:
        return "mps"

    @property
    def is_accelerator(self) -> bool:
        return True

    def synchronize(self) -> None:
        torch.mps.synchronize()

    def memory_allocated(self) -> int | None:
        return torch.mps.current_allocated_memory()

    def memory_reserved(self) -> int | None:
        return torch.mps.driver_allocated_memory()

    def memory_capacity(self) -> tuple[int, int]:
        total = int(torch.mps.recommended_max_memory())
        return max(total - torch.mps.driver_allocated_memory(), 0), total

    def peak_scope(self):
        return allocation_peak(torch.autograd.DeviceType.MPS)

    def empty_cache(self) -> None:
        torch.mps.empty_cache()

    def low_precision(self) -> LowPrecision:
        return LowPrecision(True, torch.float16, "Apple GPUs run fp16 natively")

    def profile_note(self) -> str | None:
        return "MPS: torch.profiler sees the CPU side only; GPU kernel times are not in this profile."
