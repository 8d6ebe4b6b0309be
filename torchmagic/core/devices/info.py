"""What a result keeps of the device it measured: plain data, saved and loaded with the result."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceInfo:
    kind: str                  # "cpu", "cuda", "mps"
    label: str                 # as torch names it: "cpu", "cuda:1"
    name: str                  # the model: "NVIDIA H100 80GB HBM3", the CPU's
    chosen: str | None = None  # why the run measured this device (choose_device's reason)
    uuid: str | None = None    # a GPU's, the key NVML shares (None before CUDA is initialised)

    def to_dict(self) -> dict[str, Any]:
        """As JSON holds it: the optional entries only where known."""
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def upgrade_saved(cls, data: dict[str, Any]) -> dict[str, Any]:
        """An earlier file's description: a label or a name it lacked is the kind's."""
        kind = data.get("kind", "?")
        return {**data, "kind": kind, "label": data.get("label", kind), "name": data.get("name", kind)}
