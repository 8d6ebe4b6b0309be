"""NVML readings for a CUDA device, or the one-line reason there are none."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class NvmlReading:
    name: str
    total_bytes: int
    used_bytes: int
    utilization_pct: float | None
    temperature_c: float | None
    power_w: float | None

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
        return NvmlReading(
            name=name.decode() if isinstance(name, bytes) else str(name),
            total_bytes=int(memory.total),
            used_bytes=int(memory.used),
            utilization_pct=_optional(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            temperature_c=_optional(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            power_w=_optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        )
    except Exception as exc:
        return f"NVML readings unavailable: {exc}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _optional(read):
    """Some readings are not supported on every board (MIG slices, some datacenter parts)."""
    try:
        return read()
    except Exception:
        return None
