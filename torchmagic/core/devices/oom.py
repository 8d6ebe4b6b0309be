"""Recognise an out-of-memory failure, whichever allocator raised it."""

from __future__ import annotations

import re

import torch

# Allocation failures that do not arrive as torch.OutOfMemoryError. Only statuses that mean
# "no memory": CUDNN_STATUS_INTERNAL_ERROR, CUBLAS_STATUS_EXECUTION_FAILED or an illegal memory
# access are bugs, and bisecting the batch size would hide them.
_OOM_MESSAGES = (
    "out of memory",                  # caching allocators (CUDA/HIP, MPS, XPU); the driver's own, as AcceleratorError
    "CUBLAS_STATUS_ALLOC_FAILED",     # cuBLAS workspace
    "CUDNN_STATUS_ALLOC_FAILED",      # cuDNN < 9 workspace
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",  # cuDNN 9 (a sub-status of INTERNAL_ERROR)
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUSPARSE_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
    "can't allocate memory",          # CPU DefaultCPUAllocator
    "failed to allocate",             # mkldnn / other CPU allocators
)
# cuBLAS reports a handle it could not create for want of memory as "not initialized"; from any
# other call that status means misuse.
_CUBLAS_HANDLE = re.compile(r"CUBLAS_STATUS_NOT_INITIALIZED when calling `cublas(Lt)?Create\(")


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    if isinstance(exc, RuntimeError):  # AcceleratorError and cuDNN's errors included
        message = str(exc)
        lowered = message.lower()
        return any(marker.lower() in lowered for marker in _OOM_MESSAGES) or bool(_CUBLAS_HANDLE.search(message))
    return False
