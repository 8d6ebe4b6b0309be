"""Recognise an out-of-memory failure, whichever allocator raised it."""

from __future__ import annotations

import torch

# Allocation failures that do not arrive as torch.OutOfMemoryError.
_OOM_MESSAGES = (
    "out of memory",                  # CUDA/HIP caching allocator, MPS, XPU
    "CUBLAS_STATUS_ALLOC_FAILED",     # cuBLAS workspace
    "CUDNN_STATUS_ALLOC_FAILED",      # cuDNN workspace
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
    "can't allocate memory",          # CPU DefaultCPUAllocator
    "failed to allocate",             # mkldnn / other CPU allocators
)


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    if isinstance(exc, RuntimeError):
        message = str(exc)
        return any(marker.lower() in message.lower() for marker in _OOM_MESSAGES)
    return False
