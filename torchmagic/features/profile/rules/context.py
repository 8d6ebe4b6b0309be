"""What a rule knows besides the trace: what the device can do, the user's objects, the allocator's counters."""

from __future__ import annotations

from dataclasses import dataclass

from ..amp_estimate import AmpEstimate
from ..user import UserSetup


@dataclass(frozen=True)
class AllocatorCounters:
    """The GPU caching allocator's counters (bytes) before the cell's first run and after the profile."""

    total: int                 # the device's size
    allocated_before: int
    allocated_after: int
    peak_before: int           # the high-water mark, which torchmagic never resets (it is the user's)
    peak_after: int
    device: str = "cuda:0"     # which GPU: the trace's memory events are read for this one only


@dataclass(frozen=True)
class RuleContext:
    device_type: str                 # "cpu", "cuda", "mps": as the fixes' code names it (torch.autocast)
    low_precision_fast: bool         # the device has fast bf16/fp16 matmuls
    low_precision_dtype: str | None  # "bfloat16" / "float16"
    low_precision_reason: str
    accelerator: bool = False        # a GPU: the host hands it work (on CPU the host does the work)
    traces_kernels: bool = False     # ops run as kernels the trace records: the GPU rules need those
    captures_cuda_graphs: bool = False
    autocast_keeps: str = "losses in fp32"  # what autocast leaves in fp32 on this device
    user: UserSetup = UserSetup()        # the code's model, optimizer and loader, the machine's cores
    alloc_retries: int = 0                   # allocator cache flushes during the profile (CUDA)
    allocator: AllocatorCounters | None = None  # for the profiled steps' peak (CUDA)
    # a live profile's measurements on this device (features/profile/amp_estimate.py); None for a trace
    amp_estimate: AmpEstimate | None = None
    code: str | None = None                  # expectations.code_key of the profiled code: what verify commands
