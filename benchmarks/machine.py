"""The machine a figure was measured on: CPU model, cores, torch, GPU or none."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu() -> str:
    import torch

    if not torch.cuda.is_available():
        return "no GPU"
    return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


def machine_line() -> str:
    import torch

    return (f"machine: {cpu_model()}, {os.cpu_count()} cores, {gpu()}; torch {torch.__version__}, "
            f"Python {platform.python_version()}")
