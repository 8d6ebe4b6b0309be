"""The machine a figure was measured on: CPU model and the instructions that change the figures
(bf16, int8 and AMX units), cores, torch's threads, torch, GPU or none.

Every benchmark prints ``machine_line()`` before its figures: a speedup measured here holds on
a machine with the same line, and may not elsewhere (bf16 autocast on a CPU without AVX512-BF16
or AMX runs slower than fp32; with them, 2-4x faster).
"""

from __future__ import annotations

import os
import platform
import time

from torchmagic.core.devices.base import cpu_flags
from torchmagic.core.devices.base import cpu_model_name as cpu_model  # the device layer reads it

# CPU features that decide what a technique gains: fast bf16 (avx512_bf16, amx_bf16), int8 dot
# products (avx512_vnni, avx_vnni, amx_int8), wide vectors (avx512f), or Arm's equivalents.
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8",
             "asimd", "bf16", "i8mm", "sve")


def isa_flags() -> list[str]:
    """The flags of ISA_FLAGS this CPU has (empty where /proc/cpuinfo says nothing)."""
    present = cpu_flags()
    return [flag for flag in ISA_FLAGS if flag in present]


def gpu() -> str:
    import torch

    if not torch.cuda.is_available():
        return "no GPU"
    return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


def machine_line() -> str:
    import torch

    flags = isa_flags()
    capability = torch.backends.cpu.get_cpu_capability()  # the kernels torch dispatches to here
    return (f"machine: {cpu_model()} ({', '.join(flags) or 'flags unknown'}; torch uses {capability}), "
            f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}, {gpu()}; "
            f"torch {torch.__version__}, Python {platform.python_version()}; {time.strftime('%Y-%m-%d')}")
