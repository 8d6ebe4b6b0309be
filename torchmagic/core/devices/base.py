"""What every device can tell: its name, how to wait for it, what the profiler can see."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
from dataclasses import dataclass

import torch

from .info import DeviceInfo
from .profiler import PeakReading, allocation_peak
from .resident import heap_in_use, resident_bytes, resident_peak


@dataclass(frozen=True)
class LowPrecision:
    """Whether autocast to a 16-bit float type is expected to pay off on this device."""

    fast: bool
    dtype: torch.dtype | None
    reason: str
    # what to expect of autocast where it is not fast: emulated on a CPU it is slower than float32
    expected: str = "no faster than"


@dataclass(frozen=True)
class AllocatorStats:
    """torch's caching allocator on one device (CUDA): what it holds and what went wrong."""

    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    inactive_split_bytes: int   # cached blocks split for smaller tensors, not in use: fragmentation
    num_ooms: int
    num_alloc_retries: int      # cache flushed and allocation retried: a sign of memory pressure


@dataclass(frozen=True)
class HostMemory:
    rss_bytes: int | None       # this process's resident memory
    available_bytes: int        # what the system could still give (MemAvailable)
    total_bytes: int


def host_memory() -> HostMemory:
    available, total = _host_memory()
    return HostMemory(resident_bytes(), available, total)


class Device:
    """A compute device as torchmagic sees it.  Subclasses override what differs."""

    kind = "cpu"
    chosen: str | None = None  # why a run measures this device (set by choose_device)
    # What the device can do, for the features' choices (a fake device declares what it fakes):
    captures_cuda_graphs = False  # torch.compile's reduce-overhead and max-autotune replay CUDA graphs
    has_tf32 = False              # allowing TF32 can speed up fp32 matmuls and convolutions
    # what a run takes beyond torch's allocations grows with them (a process's resident memory),
    # rather than by blocks that round them up (a caching allocator's reserve)
    footprint_scales = False
    runs_dynamic_int8 = False     # torch.ao's dynamic int8 kernels run here
    pinned_memory_helps = False   # batches are copied here from host memory (DataLoader pin_memory)
    traces_kernels = False        # ops run asynchronously as kernels the profiler records (CUPTI), so an
                                  # op's host time is its launch and the kernels' times are the device's
    autocast_keeps = "losses in fp32, while softmax and norms follow their input's dtype"  # autocast's policy

    def __init__(self, index: int | None = None):
        self.index = index

    @property
    def name(self) -> str:
        return platform.processor() or platform.machine() or "CPU"

    @property
    def label(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    @property
    def is_accelerator(self) -> bool:
        return False

    @property
    def autotunes_per_shape(self) -> bool:
        """Whether kernels (and their workspaces) are chosen afresh for each new input shape."""
        return False


    def synchronize(self) -> None:
        """Wait until queued device work is done (no-op where work is synchronous)."""

    def profiler_activities(self) -> list:
        return [torch.profiler.ProfilerActivity.CPU]

    def memory_allocated(self) -> int | None:
        """Bytes held by torch's allocator on this device, where the allocator tracks it."""
        return None

    def memory_reserved(self) -> int | None:
        return None

    def has_context(self) -> bool:
        """Whether this process holds a context on the device (memory NVML counts as its own)."""
        return False

    def graph_pool_bytes(self) -> int | None:
        """Bytes the allocator holds in private pools, where CUDA graphs record; None where there are none."""
        return None

    def memory_capacity(self) -> tuple[int, int]:
        """(free, total) bytes this process could still use, and the device's size."""
        raise NotImplementedError

    def memory_in_use(self) -> int | None:
        """What this process holds on the device: torch's allocations where torch counts them,
        else the process's resident memory (CPU)."""
        allocated = self.memory_allocated()
        return allocated if allocated is not None else resident_bytes()

    def memory_held(self) -> int | None:
        """What this process holds now that a step can keep from one call to the next, read exactly enough
        to see it grow: torch's allocations where torch counts them, else the blocks malloc handed out and
        has not had back (glibc: torch's CPU tensors among them); None where neither is known (the
        resident size moves with the pages malloc keeps, by more than a leak)."""
        allocated = self.memory_allocated()
        return allocated if allocated is not None else heap_in_use()

    def allocator_stats(self) -> AllocatorStats | None:
        """The caching allocator's counters, where torch keeps them (CUDA)."""
        return None

    def sampler(self):
        """A cheap repeated reading for a watch: ``read()`` -> (used bytes, utilisation %) from
        NVML where there is one, and ``close()``.  None where there is nothing to read."""
        return None

    def reset_peak_stats(self) -> bool:
        """Reset the allocator's peak counters; False where there are none."""
        return False

    def peak_scope(self) -> contextlib.AbstractContextManager[PeakReading]:
        """Peak of torch's allocations on this device within a ``with`` block, above its start
        (and, where it is read alongside, the process's footprint on the device)."""
        return allocation_peak(torch.autograd.DeviceType.CPU)

    def footprint_scope(self) -> contextlib.AbstractContextManager[PeakReading] | None:
        """Where the footprint (all the process takes from the device, beyond torch's allocations)
        must be read in a run of its own, without the profiler: a scope that reads it; else None
        (CUDA reads the allocator's reserved growth in ``peak_scope``)."""
        return None

    def allocation_history(self) -> contextlib.AbstractContextManager:
        """The allocator's own record of the allocations made within a ``with`` block, each with the
        Python stack that made it: an AllocationHistory, filled at the block's end, where the device
        keeps one (CUDA); else None."""
        return contextlib.nullcontext(None)

    def empty_cache(self) -> None:
        """Return cached, unused blocks to the device (no cache on CPU)."""

    def settle_allocator(self) -> None:
        """Bring the host allocator to the state a long-running process reaches, where it stays, so that
        timings taken minutes apart meet the same allocator (a no-op where nothing is known to move)."""

    def rng_state(self):
        """The random generators a step may draw from, to put back after probing."""
        return torch.get_rng_state()

    def set_rng_state(self, state) -> None:
        torch.set_rng_state(state)

    def low_precision(self) -> LowPrecision:
        raise NotImplementedError

    def nvml(self):
        """NVML's view of this device (an NvmlReading), a sentence saying why there is none,
        or None where NVML does not apply (CPU, MPS)."""
        return None

    def energy_mj(self) -> int | None:
        """The device's cumulative energy counter in mJ, where the driver keeps one (NVIDIA GPUs)."""
        return None

    def profile_note(self) -> str | None:
        """What a profile on this device cannot see, in one line."""
        return None

    def choice_note(self) -> str | None:
        """Which device was measured and why, where the machine offered a choice."""
        return f"Measured on {self.label} ({self.name}): {self.chosen}." if self.chosen else None

    def describe(self) -> DeviceInfo:
        return DeviceInfo(self.kind, self.label, self.name, chosen=self.chosen or None)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}: {self.name}>"


class CpuDevice(Device):
    kind = "cpu"
    footprint_scales = True
    runs_dynamic_int8 = True

    def profile_note(self) -> str | None:
        # with a GPU present, the choice note says why the CPU was measured instead
        return None if torch.cuda.is_available() else "CPU-only profile: no CUDA device found."

    def memory_capacity(self) -> tuple[int, int]:
        return _host_memory()

    def footprint_scope(self) -> contextlib.AbstractContextManager[PeakReading]:
        """The process's resident memory: what a container's memory limit counts."""
        return resident_peak()

    def empty_cache(self) -> None:
        """Hand freed heap back to the OS (glibc keeps it otherwise), so the process's resident
        memory shows what is really held."""
        _malloc_trim()

    def settle_allocator(self) -> None:
        """glibc serves a block over its mmap threshold with fresh pages each time (page faults on every
        call), and raises that threshold (up to 32 MiB, the trim threshold to twice it) when such a block is
        freed, so a step's blocks change from one to the other with what the process freed last: the same
        BERT step timed 6 or 10 ms from one comparison to the next, its speedups 1.05x or 1.44x.  Freeing
        one block of the largest size that raises it settles both where any process that once freed a
        32 MiB tensor has them, for good (glibc's own rule; nothing to put back)."""
        libc = _libc()
        if libc is None or not hasattr(libc, "malloc"):
            return
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        block = libc.malloc(_MMAP_THRESHOLD_MAX - 2 * _PAGE)  # a chunk of at most 32 MiB with its header
        if block:
            libc.free(block)  # untouched: no page of it was ever resident

    @property
    def name(self) -> str:
        return cpu_model_name()


    @property
    def label(self) -> str:
        return "cpu"

    def low_precision(self) -> LowPrecision:
        flags = cpu_flags()
        if flags & {"amx_bf16", "avx512_bf16"}:
            native = "AMX" if "amx_bf16" in flags else "AVX512-BF16"
            return LowPrecision(True, torch.bfloat16, f"this CPU has native bf16 instructions ({native})")
        widest = "AVX512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
        lacking = "no AVX512-BF16 or AMX" + (f", only {widest}" if widest else "")
        if "avx512f" in flags or "asimd" in flags or platform.machine() == "arm64":
            return LowPrecision(False, torch.bfloat16, f"bf16 runs, but this CPU has no native bf16 matmul ({lacking})",
                                "slower than")
        return LowPrecision(False, None, f"this CPU has no fast 16-bit float instructions ({lacking})",
                            "slower than")


_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: 4 Mi x sizeof(long)
_PAGE = 4096


@functools.lru_cache(maxsize=1)
def _libc():
    if platform.system() != "Linux":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # musl and other libcs have no malloc_trim
        return None


def _malloc_trim() -> None:
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _host_memory() -> tuple[int, int]:
    """(available, total) RAM: the kernel's MemAvailable estimate, which counts reclaimable cache."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
        return info["MemAvailable"], info["MemTotal"]
    except (OSError, KeyError, ValueError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (x86 "flags", Arm "Features") from /proc/cpuinfo; empty where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(maxsize=1)
def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"
