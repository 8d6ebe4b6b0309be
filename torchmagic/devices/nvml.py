"""NVML readings for a CUDA device, or the one-line reason there are none."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class NvmlProcess:
    pid: int
    used_bytes: int | None  # None where the driver does not say (some Windows and container setups)


@dataclass(frozen=True)
class NvmlReading:
    name: str
    total_bytes: int
    used_bytes: int
    utilization_pct: float | None
    temperature_c: float | None
    power_w: float | None
    processes: tuple[NvmlProcess, ...] | None = None  # None: the list could not be read
    processes_note: str | None = None                 # why not
    mig: bool = False                                 # a MIG slice: memory is the slice's, no utilisation

    def to_dict(self) -> dict:
        return asdict(self)


def nvml_reading(uuid: str | None, index: int | None, nvml=None) -> NvmlReading | str:
    """Read one device through NVML; on any failure return the reason as a sentence.

    ``uuid`` is preferred over ``index`` because CUDA_VISIBLE_DEVICES renumbers CUDA
    devices but not NVML's.  ``nvml`` is the pynvml module, injectable for tests.
    """
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return "NVML readings unavailable: nvidia-ml-py is not installed"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError and friends: no driver, no permission, container
        return f"NVML readings unavailable: NVML failed to initialise ({exc})"
    try:
        if uuid:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(index or 0)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        name = nvml.nvmlDeviceGetName(handle)
        processes, processes_note = _processes(nvml, handle)
        return NvmlReading(
            name=name.decode() if isinstance(name, bytes) else str(name),
            total_bytes=int(memory.total),
            used_bytes=int(memory.used),
            utilization_pct=_optional(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            temperature_c=_optional(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            power_w=_optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
            processes=processes,
            processes_note=processes_note,
            mig=bool(_optional(lambda: nvml.nvmlDeviceIsMigDeviceHandle(handle))),
        )
    except Exception as exc:
        return f"NVML readings unavailable: {exc}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


class NvmlSampler:
    """NVML kept open for repeated cheap readings of one device (memory used, utilisation),
    as a watch needs: initialising NVML for every sample would cost milliseconds each."""

    def __init__(self, uuid: str | None, index: int | None, nvml=None):
        self.nvml, self.handle, self.note = None, None, None
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                self.note = "nvidia-ml-py is not installed"
                return
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self.note = f"NVML failed to initialise ({exc})"
            return
        self.nvml = nvml
        try:
            self.handle = (nvml.nvmlDeviceGetHandleByUUID(uuid.encode()) if uuid
                           else nvml.nvmlDeviceGetHandleByIndex(index or 0))
        except Exception as exc:
            self.note = f"NVML does not know this device ({exc})"
            self.close()

    def read(self) -> tuple[int | None, float | None]:
        """(bytes used by all processes, utilisation %), None where unknown."""
        if self.handle is None:
            return None, None
        used = _optional(lambda: int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used))
        busy = _optional(lambda: float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
        return used, busy

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.nvml, self.handle = None, None


def _processes(nvml, handle) -> tuple[tuple[NvmlProcess, ...] | None, str | None]:
    """Compute and graphics processes on the device, each once (a process can be both)."""
    try:
        found: dict[int, int | None] = {}
        for read in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
            for proc in read(handle):
                used = getattr(proc, "usedGpuMemory", None)
                found[int(proc.pid)] = int(used) if isinstance(used, int) and used >= 0 else found.get(int(proc.pid))
    except Exception as exc:  # NVMLError_NoPermission in many containers, NotSupported on MIG slices
        return None, f"NVML's process list is not visible here ({exc})"
    return tuple(NvmlProcess(pid, used) for pid, used in sorted(found.items())), None


def _optional(read):
    """Some readings are not supported on every board (MIG slices, some datacenter parts)."""
    try:
        return read()
    except Exception:
        return None
