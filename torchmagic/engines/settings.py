"""torch's process-wide settings that a measurement may touch, captured and put back.

A variant runs the user's code under autocast, a matmul precision or inference mode; if
that code raises or is interrupted halfway, nothing of it may outlive the measurement.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

_AUTOCAST_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class TorchSettings:
    grad_enabled: bool
    autocast: tuple[tuple[str, bool, torch.dtype], ...]   # (device type, enabled, dtype)
    autocast_cache: bool
    matmul_precision: str
    default_dtype: torch.dtype
    deterministic: bool
    num_threads: int
    cudnn: tuple[bool, bool, bool, bool]                   # enabled, benchmark, deterministic, allow_tf32
    cuda_matmul_tf32: bool

    @classmethod
    def capture(cls) -> TorchSettings:
        cudnn = torch.backends.cudnn
        return cls(
            grad_enabled=torch.is_grad_enabled(),
            autocast=tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES),
            autocast_cache=torch.is_autocast_cache_enabled(),
            matmul_precision=torch.get_float32_matmul_precision(),
            default_dtype=torch.get_default_dtype(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            num_threads=torch.get_num_threads(),
            cudnn=(cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32),
            cuda_matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
        )

    def restore(self) -> None:
        """Set back whatever differs (setting an unchanged value can still cost, e.g. threads)."""
        now = TorchSettings.capture()
        if now == self:
            return
        torch.set_grad_enabled(self.grad_enabled)
        for device, enabled, dtype in self.autocast:
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(self.autocast_cache)
        if now.matmul_precision != self.matmul_precision:
            torch.set_float32_matmul_precision(self.matmul_precision)
        torch.set_default_dtype(self.default_dtype)
        if now.deterministic != self.deterministic:
            torch.use_deterministic_algorithms(self.deterministic)
        if now.num_threads != self.num_threads:
            torch.set_num_threads(self.num_threads)
        cudnn = torch.backends.cudnn
        cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32 = self.cudnn
        torch.backends.cuda.matmul.allow_tf32 = self.cuda_matmul_tf32

    def differences(self, other: TorchSettings) -> dict[str, tuple]:
        """Settings that differ: name -> (this value, other value)."""
        mine, theirs = asdict(self), asdict(other)
        return {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}
