"""The device layer: the only code in torchmagic that knows CUDA from CPU (and MPS).

Everything above it asks a :class:`Device` to synchronise, read memory, name the
profiler activities or say whether low precision is fast.  Tests inject a fake
device with :func:`use_device`, so the GPU logic above this layer runs on CPU.
"""

from .base import AllocatorStats, CpuDevice, Device, HostMemory, LowPrecision, host_memory
from .cuda import CudaDevice
from .info import DeviceInfo
from .mps import MpsDevice
from .nvml import NvmlProcess, NvmlReading, nvml_reading
from .oom import is_out_of_memory
from .select import choose_device, nccl_gpus, parse_device, rank_device, use_device, visible_accelerators

__all__ = [
    "AllocatorStats",
    "CpuDevice",
    "HostMemory",
    "NvmlProcess",
    "host_memory",
    "visible_accelerators",
    "nccl_gpus",
    "CudaDevice",
    "Device",
    "DeviceInfo",
    "LowPrecision",
    "MpsDevice",
    "NvmlReading",
    "choose_device",
    "parse_device",
    "rank_device",
    "is_out_of_memory",
    "nvml_reading",
    "use_device",
]
