"""NVML readings for a CUDA device, or the one-line reason there are none."""

from __future__ import annotations

from dataclasses import asdict, dataclass

_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long


@dataclass(frozen=True)
class NvmlProcess:
    pid: int                # as NVML sees it: the host's PID, not this container's
    used_bytes: int | None  # None where the driver does not say (some Windows and container setups)


@dataclass(frozen=True)
class NvmlReading:
    name: str
    total_bytes: int
    used_bytes: int                                   # in use, the driver's reserve included (as v1 counts it)
    utilization_pct: float | None
    temperature_c: float | None
    power_w: float | None
    processes: tuple[NvmlProcess, ...] | None = None  # None: the list could not be read
    processes_note: str | None = None                 # why not, or what the list lacks
    mig: bool = False                                 # a MIG slice: memory is the slice's, no utilisation
    driver_reserved_bytes: int | None = None          # of used_bytes, the driver's own; None: v1, not told apart

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
        handle = _device_handle(nvml, uuid, index)
        total, used, driver_reserved = _memory(nvml, handle)
        name = nvml.nvmlDeviceGetName(handle)
        processes, processes_note = _processes(nvml, handle)
        return NvmlReading(
            name=name.decode() if isinstance(name, bytes) else str(name),
            total_bytes=total,
            used_bytes=used,
            utilization_pct=_optional(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            temperature_c=_optional(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            power_w=_optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
            processes=processes,
            processes_note=processes_note,
            mig=bool(_optional(lambda: nvml.nvmlDeviceIsMigDeviceHandle(handle))),
            driver_reserved_bytes=driver_reserved,
        )
    except Exception as exc:
        return f"NVML readings unavailable: {exc}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def energy_mj(uuid: str | None, index: int | None, nvml=None) -> int | None:
    """The device's energy counter (mJ since the driver loaded; Volta and newer), or None where NVML
    cannot say.  The driver refreshes it every few to tens of milliseconds."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        return int(nvml.nvmlDeviceGetTotalEnergyConsumption(_device_handle(nvml, uuid, index)))
    except Exception:  # NotSupported before Volta, or on a MIG slice
        return None
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
        self._memory_v2 = True  # until the driver says it has only v1
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
            self.handle = _device_handle(nvml, uuid, index)
        except Exception as exc:
            self.note = f"NVML does not know this device ({exc})"
            self.close()

    def read(self) -> tuple[int | None, float | None]:
        """(bytes in use on the device, as ``NvmlReading.used_bytes``; utilisation %), None where unknown."""
        if self.handle is None:
            return None, None
        memory = _optional(lambda: _memory(self.nvml, self.handle, self._memory_v2))
        if memory is not None and memory[2] is None:
            self._memory_v2 = False  # do not ask again every sample
        busy = _optional(lambda: float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
        return (memory[1] if memory else None), busy

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.nvml, self.handle = None, None


def _device_handle(nvml, uuid: str | None, index: int | None):
    """The NVML handle of the CUDA device with this UUID (by index only where there is none).

    CUDA gives a MIG slice's UUID without saying it is one; NVML names a slice ``MIG-<uuid>``
    (drivers R470 on) and a whole GPU ``GPU-<uuid>``, so a bare UUID, or one with the wrong
    prefix, is looked up in both forms.
    """
    if not uuid:
        return nvml.nvmlDeviceGetHandleByIndex(index or 0)
    bare = uuid[4:] if uuid[:4] in ("GPU-", "MIG-") else uuid
    names = list(dict.fromkeys([uuid if uuid != bare else f"GPU-{bare}", f"GPU-{bare}", f"MIG-{bare}"]))
    for name in names:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(name.encode())
        except Exception as exc:
            # any other error (no permission, GPU lost) is the real answer: do not hide it behind "Not Found"
            if not _is_error(nvml, exc, "NVMLError_NotFound", "NVMLError_InvalidArgument"):
                raise
            error = exc
    raise LookupError(f"no device with UUID {' or '.join(names)} ({error})")


def _memory(nvml, handle, v2: bool = True) -> tuple[int, int, int | None]:
    """(total, used, driver-reserved) bytes; used includes the driver's reserve in both versions.

    v1's ``used`` counts memory the driver sets aside, which no process holds; v2 reports it
    apart.  Older drivers (FunctionNotFound, ArgumentVersionMismatch) and bindings (no
    ``nvmlMemory_v2``) have only v1: reserve None.
    """
    version = getattr(nvml, "nvmlMemory_v2", None) if v2 else None
    if version is not None:
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return int(info.total), int(info.used) + int(info.reserved), int(info.reserved)
        except Exception:  # a real failure (GPU lost) fails v1 too, and is raised there
            pass
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.total), int(info.used), None


def _processes(nvml, handle) -> tuple[tuple[NvmlProcess, ...] | None, str | None]:
    """Compute and graphics processes on the device, each once (a process can be in both lists).

    The lists are read apart: datacenter GPUs and MIG slices answer NotSupported for graphics,
    which must not lose the compute list.  Without the compute list there is no list: every
    CUDA process, this one included, would be missing from it.
    """
    found: dict[int, int | None] = {}
    notes = []
    for kind in ("Compute", "Graphics"):
        try:
            listed = _running_processes(nvml, handle, kind)
        except Exception as exc:  # NVMLError_NoPermission in many containers, NotSupported on MIG slices
            if kind == "Compute":
                return None, f"NVML's process list is not visible here ({exc})"
            if not _is_error(nvml, exc, "NVMLError_NotSupported"):  # NotSupported: no graphics contexts here
                notes.append(f"NVML's graphics process list is not visible here ({exc})")
            continue
        for proc in listed:
            pid, used = int(proc.pid), getattr(proc, "usedGpuMemory", None)
            used = int(used) if isinstance(used, int) and 0 <= used < _NOT_AVAILABLE else None
            if pid not in found or (used is not None and used > (found[pid] or -1)):
                found[pid] = used  # in both lists: the figure that is known, or the larger
    return tuple(NvmlProcess(pid, used) for pid, used in sorted(found.items())), "; ".join(notes) or None


def _running_processes(nvml, handle, kind: str) -> list:
    """One of NVML's process lists; drivers older than the bindings lack the newest struct
    version (the bindings raise a library mismatch), so the _v2 call is tried then."""
    try:
        return getattr(nvml, f"nvmlDeviceGet{kind}RunningProcesses")(handle)
    except Exception as exc:
        older = getattr(nvml, f"nvmlDeviceGet{kind}RunningProcesses_v2", None)
        if older is None or not _is_error(nvml, exc, "NVMLLibraryMismatchError", "NVMLError_FunctionNotFound"):
            raise
        return older(handle)


def _is_error(nvml, exc: BaseException, *names: str) -> bool:
    """Whether ``exc`` is one of pynvml's error classes of these names.  A module without
    them (an old or fake binding) cannot tell, and every error counts as one of them."""
    classes = tuple(cls for cls in (getattr(nvml, name, None) for name in names) if isinstance(cls, type))
    return isinstance(exc, classes) if classes else True


def _optional(read):
    """Some readings are not supported on every board (MIG slices, some datacenter parts)."""
    try:
        return read()
    except Exception:
        return None
