"""The peaks of the machine at hand, measured: matmul FLOP/s per dtype and copy bandwidth, by short
microbenchmarks on the device, once per Python process (cached).  A roofline needs the roofs of the
device the profile ran on, not a datasheet's, which a CPU has none of and a GPU rarely reaches."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..devices import Device

MATMUL_MIN_S = 0.01      # grow the matmul until one takes this long (caches and launch costs amortised)
MATMUL_MAX_N = {False: 2048, True: 8192}   # by is_accelerator
COPY_BYTES = {False: 128 * 2**20, True: 1024 * 2**20}  # past every cache
REPEATS = 3              # the best of these: a peak is what the device can do, not what it did once
FREE_SHARE = 8           # on a GPU, the buffers take at most 1/FREE_SHARE of its free memory (the user's
                         # model and batches hold the rest); a device too full for useful sizes gets none


@dataclass(frozen=True)
class Peaks:
    flops_per_s: dict[str, float]    # dtype ("float32", "bfloat16", "float16") -> matmul FLOP/s
    bytes_per_s: float               # copy bandwidth: bytes read plus written per second
    seconds: float                   # what measuring them took
    threads: int | None              # on CPU: torch's intra-op threads they were measured with


_cache: dict[tuple[str, int | None, tuple[str, ...]], Peaks] = {}


def measured_peaks(device: Device, dtypes: tuple[str, ...] = ("float32",)) -> Peaks:
    """The device's matmul FLOP/s for each dtype and its copy bandwidth (cached per device, thread
    count and dtypes)."""
    threads = None if device.is_accelerator else torch.get_num_threads()
    key = (device.label, threads, tuple(dtypes))
    if key not in _cache:
        started = time.perf_counter()
        budget = device.memory_capacity()[0] // FREE_SHARE if device.is_accelerator else None
        flops = {dtype: _matmul_flops(device, getattr(torch, dtype), budget) for dtype in dtypes}
        _cache[key] = Peaks(flops, _copy_bandwidth(device, budget), time.perf_counter() - started, threads)
    return _cache[key]


class PeaksUnmeasured(RuntimeError):
    """Too little free device memory to measure the peaks with buffers of a useful size."""


def _best(fn, device: Device) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        device.synchronize()
        start = time.perf_counter()
        fn()
        device.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def _matmul_flops(device: Device, dtype: torch.dtype, budget: int | None) -> float:
    """The largest square matmul that is fast enough to time, within ``budget`` bytes (a, b, the
    product and a float32 staging copy: 4 n² elements at most 4 bytes)."""
    where, n = torch.device(device.label), 256
    largest = MATMUL_MAX_N[device.is_accelerator]
    while budget is not None and largest > 256 and 4 * largest * largest * 4 > budget:
        largest //= 2
    if budget is not None and 4 * n * n * 4 > budget:
        raise PeaksUnmeasured(f"{budget / 2**20:.0f} MiB of free device memory to measure in")
    while True:
        a = torch.randn(n, n, device=where).to(dtype)
        b = torch.randn(n, n, device=where).to(dtype)
        a @ b  # warm: kernels chosen, pages touched
        seconds = _best(lambda: a @ b, device)
        if seconds >= MATMUL_MIN_S or n >= largest:
            return 2 * n**3 / seconds
        n *= 2


def _copy_bandwidth(device: Device, budget: int | None) -> float:
    where = torch.device(device.label)
    size = COPY_BYTES[device.is_accelerator]
    if budget is not None:
        size = min(size, budget // 2)  # source and target
    source = torch.ones(max(size, 4) // 4, device=where)
    target = torch.empty_like(source)
    target.copy_(source)
    seconds = _best(lambda: target.copy_(source), device)
    return 2 * source.numel() * 4 / seconds
