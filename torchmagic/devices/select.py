"""Which device torchmagic measures: the injected one, else CUDA, MPS, CPU in that order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .base import CpuDevice, Device
from .cuda import CudaDevice, MpsDevice

_injected: list[Device] = []


def current_device() -> Device:
    if _injected:
        return _injected[-1]
    if torch.cuda.is_available():
        return CudaDevice()
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return MpsDevice()
    return CpuDevice()


def visible_accelerators() -> list[Device]:
    """Every GPU this process can use (CUDA_VISIBLE_DEVICES applied), or the injected one."""
    if _injected:
        return [d for d in _injected[-1:] if d.is_accelerator]
    if torch.cuda.is_available():
        return [CudaDevice(i) for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return [MpsDevice()]
    return []


@contextlib.contextmanager
def use_device(device: Device) -> Iterator[Device]:
    """Make ``device`` the one every engine measures, for the duration of the block (nests)."""
    _injected.append(device)
    try:
        yield device
    finally:
        _injected.remove(device)
