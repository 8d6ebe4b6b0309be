"""What ``%%torchprofile`` / ``torchmagic.profile`` were asked for: the options a profile runs with and keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...core.limits import SettingError, check_count
from ...core.user_files import check_new_file

SORT_KEYS = {
    # our names, and the names torch's key_averages().table(sort_by=...) users already know
    "self_cpu": "self_cpu_us", "self_cpu_time_total": "self_cpu_us",
    "total_cpu": "total_cpu_us", "cpu_time_total": "total_cpu_us",
    "self_device": "self_device_us", "self_cuda": "self_device_us",
    "self_device_time_total": "self_device_us", "self_cuda_time_total": "self_device_us",
    "calls": "calls", "count": "calls",
    "flops": "flops",
    "memory": "allocated_bytes", "self_cpu_memory_usage": "allocated_bytes",
}



@dataclass(frozen=True)
class ProfileOptions:
    steps: int = 1
    warmup: int = 0
    record_shapes: bool = False
    memory: bool = False
    stack: bool = False
    flops: bool = False
    trace: str | None = None
    trace_overwrite: bool = False  # replace a file already at ``trace`` (else refused)
    sort: str = "auto"
    top: int = 15
    # host memory the profile may take, its events once the profiler stops included (budget.py): bytes, or a
    # fraction (up to 1) of the memory available when it starts; None: budget.DEFAULT_SHARE of it
    capture_budget: float | None = None

    def __post_init__(self):
        if self.steps < 1:
            raise SettingError("steps", f"must be at least 1, got {self.steps}")
        if self.warmup < 0:
            raise SettingError("warmup", f"must be 0 or more, got {self.warmup}")
        if self.top < 1:
            raise SettingError("top", f"must be at least 1, got {self.top}")
        for name in ("steps", "warmup", "top"):
            check_count(name, getattr(self, name))
        if self.capture_budget is not None and not 0 < self.capture_budget < math.inf:
            raise SettingError("capture_budget", "must be a positive number (bytes, or a fraction of the available "
                                                 f"memory), got {self.capture_budget}")
        if self.sort != "auto" and self.sort not in SORT_KEYS:
            raise SettingError("sort", f"{self.sort!r} is an unknown sort key; choose from auto, {', '.join(SORT_KEYS)}")

    def check_files(self) -> None:
        """Refuse a --trace path where a file is (unless overwriting) or none can be written: checked by the
        engine before it runs, not here, as a saved profile's options are loaded long after its trace was written."""
        if self.trace is not None:
            check_new_file("trace", self.trace, self.trace_overwrite)
