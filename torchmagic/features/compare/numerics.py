"""How far a variant's output is from the fp32 eager baseline's.

Outputs may be a tensor, a float loss, or any nesting of lists, tuples, dicts, named tuples
and dataclasses holding them.  Errors are measured in float64 on the CPU, for the output as
a whole: a network's output in bf16 is never elementwise close to fp32 near zero, so the
relative error is the largest absolute error over the largest baseline magnitude, and the
check is ``max|a - b| <= atol + rtol * max|b|``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

# (rtol, atol) by the lowest precision a variant computes in.  Whole-network outputs, not
# single ops: errors accumulate over layers, so these sit above torch.testing's per-op values.
TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-4, 1e-6),    # same precision, reordered sums (compile, channels_last, inference_mode)
    "tf32": (5e-3, 1e-5),    # 10-bit mantissa in matmuls
    "fp16": (1e-2, 1e-5),    # 10-bit mantissa everywhere autocast casts
    "bf16": (5e-2, 1e-5),    # 7-bit mantissa (epsilon 7.8e-3)
    "int8": (1e-1, 1e-5),    # 256 levels per weight row
}
PRECISION_ORDER = ("fp32", "tf32", "fp16", "bf16", "int8")  # increasing error

_MAX_LEAVES = 10_000  # bounded walk of the output structure


@dataclass(frozen=True)
class Reference:
    """The baseline output, flattened and copied off the device as float64."""

    leaves: tuple[tuple[str, torch.Tensor], ...]
    skipped: int  # leaves that are neither tensors nor numbers (strings, None, objects)


@dataclass(frozen=True)
class Error:
    max_abs: float
    max_rel: float            # max_abs / max|baseline|
    ok: bool
    problem: str | None = None  # why the outputs could not be compared leaf by leaf


def reference(output: Any) -> Reference | None:
    """None when the output holds nothing numeric to compare."""
    leaves, skipped = _flatten(output)
    return Reference(tuple(leaves), skipped) if leaves else None


def compare(output: Any, ref: Reference, rtol: float, atol: float) -> Error:
    leaves, _ = _flatten(output)
    names = [name for name, _ in leaves]
    ref_names = [name for name, _ in ref.leaves]
    if names != ref_names:
        missing = sorted(set(ref_names) - set(names)) or sorted(set(names) - set(ref_names))
        return Error(math.inf, math.inf, False, f"the output's structure differs ({', '.join(missing[:3]) or 'order'})")
    worst_abs, scale = 0.0, 0.0
    for (name, value), (_, base) in zip(leaves, ref.leaves):
        if value.shape != base.shape:
            return Error(math.inf, math.inf, False,
                         f"{name or 'output'} has shape {tuple(value.shape)}, the baseline {tuple(base.shape)}")
        if value.numel() == 0:
            continue
        same = (value == base) | (value.isnan() & base.isnan())  # equal infinities and NaNs agree
        diff = torch.where(same, 0.0, (value - base).abs()).nan_to_num(nan=math.inf, posinf=math.inf)
        worst_abs = max(worst_abs, float(diff.max()))
        finite = base[base.isfinite()]
        if finite.numel():
            scale = max(scale, float(finite.abs().max()))
    rel = worst_abs / scale if scale > 0 else (0.0 if worst_abs == 0 else math.inf)
    return Error(worst_abs, rel, worst_abs <= atol + rtol * scale)


def tolerance(precision: str, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    default_rtol, default_atol = TOLERANCES[precision]
    return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


def _flatten(output: Any) -> tuple[list[tuple[str, torch.Tensor]], int]:
    leaves: list[tuple[str, torch.Tensor]] = []
    skipped = 0
    stack: list[tuple[str, Any, int]] = [("", output, 0)]
    seen: set[int] = set()
    while stack and len(leaves) < _MAX_LEAVES:
        name, value, depth = stack.pop()
        if isinstance(value, torch.Tensor):
            leaves.append((name, _as_float64(value)))
        elif isinstance(value, bool | int | float | complex):
            leaves.append((name, torch.tensor(value, dtype=torch.complex128 if isinstance(value, complex)
                                               else torch.float64)))
        elif depth >= 8 or id(value) in seen:
            skipped += 1
        elif isinstance(value, dict):
            seen.add(id(value))
            stack.extend((f"{name}[{k!r}]", v, depth + 1) for k, v in reversed(list(value.items())))
        elif isinstance(value, list | tuple):
            seen.add(id(value))
            fields = getattr(value, "_fields", None)  # named tuples name their leaves
            keys = [f".{f}" for f in fields] if fields else [f"[{i}]" for i in range(len(value))]
            stack.extend((name + k, v, depth + 1) for k, v in reversed(list(zip(keys, value))))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            seen.add(id(value))
            stack.extend((f"{name}.{f.name}", getattr(value, f.name), depth + 1)
                         for f in reversed(dataclasses.fields(value)))
        else:
            skipped += 1
    return leaves, skipped


def _as_float64(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    if tensor.is_sparse or tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    dtype = torch.complex128 if tensor.is_complex() else torch.float64
    return tensor.to("cpu", dtype, copy=True)
