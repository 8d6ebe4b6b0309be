"""Where a profiled step's time goes: the categories the summary splits it into, and what an event's
name says about its category (the phase it opens, a sync, a copy, a view that launches nothing)."""

from __future__ import annotations

import functools

from ...core.measure.timing import DEVICE_WAIT_MARKER
from .kineto import COLLECTIVE_PREFIXES, DATA_PREFIX, OPTIMIZER_PREFIXES, is_backward_node, is_compile

DATA, FORWARD, BACKWARD, OPTIMIZER, COPIES, SYNCS, COMMUNICATION, DEVICE_WAIT, START_UP, OTHER = (
    "data loading",
    "forward",
    "backward",
    "optimizer",
    "copies",
    "syncs",
    "communication",  # collectives: gloo's and MPI's run on the host, NCCL's range only enqueues its kernels
    "device wait",  # the CPU waiting at step end for queued GPU work (GPU-bound: good)
    "start-up",     # one-time costs (the CUDA context, lazy kernel loading, a first compile): not the steady state
    "other",        # Python between ops, user annotations' own time
)
CATEGORIES = (DATA, FORWARD, BACKWARD, OPTIMIZER, COPIES, SYNCS, COMMUNICATION, DEVICE_WAIT, START_UP, OTHER)

_PHASE_PREFIXES = (
    (DEVICE_WAIT_MARKER, DEVICE_WAIT),
    (DATA_PREFIX, DATA),
    *((prefix, OPTIMIZER) for prefix in OPTIMIZER_PREFIXES),
    *((prefix, COMMUNICATION) for prefix in COLLECTIVE_PREFIXES),
)
# Ops that read a device value on the host: a full stall when the tensor lives on a GPU.
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero",
                      "aten::equal", "aten::unique", "aten::_unique2", "aten::masked_select"})
# Runtime calls that block the host until the device catches up (CUDA traces only).
SYNC_RUNTIME = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                          "cudaMemcpy", "hipStreamSynchronize", "hipDeviceSynchronize"})
COPY_OPS = frozenset({"aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone",
                      "aten::_copy_from", "aten::_copy_from_and_resize", "aten::pin_memory",
                      "aten::_pin_memory"})
LOW_PRECISION_DTYPES = frozenset({"c10::BFloat16", "c10::Half", "c10::Float8_e4m3fn", "c10::Float8_e5m2"})
# Ops that never launch device work (views, metadata, allocation): a step of only these on a GPU has no kernels
NO_KERNEL_OPS = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::_unsafe_view",
    "aten::reshape", "aten::_reshape_alias", "aten::as_strided", "aten::t", "aten::transpose", "aten::permute",
    "aten::expand", "aten::squeeze", "aten::unsqueeze", "aten::select", "aten::slice", "aten::narrow",
    "aten::alias", "aten::detach", "aten::detach_", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
    "aten::split", "aten::chunk", "aten::unbind", "aten::flatten", "aten::requires_grad_", "aten::size",
})


@functools.lru_cache(maxsize=4096)
def phase_of(name: str) -> str | None:
    """The phase an event opens (cached: a trace repeats a few hundred names)."""
    for prefix, phase in _PHASE_PREFIXES:
        if name.startswith(prefix):
            return phase
    if is_compile(name):
        return START_UP
    return BACKWARD if is_backward_node(name) else None
