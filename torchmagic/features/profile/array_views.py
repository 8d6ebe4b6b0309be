"""Python arrays (``array.array``) and tensors over the same values: the traces' columns and the interval sets
grow as arrays (appending is cheap) and are worked on as tensors (a view: nothing copied)."""

from __future__ import annotations

from array import array

import torch


def tensor_view(values: array, dtype: torch.dtype) -> torch.Tensor:
    """An array's values as a tensor sharing its memory (``dtype`` of the array's item size; an empty array gives
    an empty tensor, which frombuffer refuses).  While the view lives the array cannot be resized: drop it, or
    clone it, before the array grows."""
    return torch.frombuffer(values, dtype=dtype) if len(values) else torch.empty(0, dtype=dtype)


def doubles(values: torch.Tensor) -> array:
    """A tensor of floats copied into a new array ('d')."""
    out = array("d", [0.0]) * len(values)  # (made at its size: no bytes of that size made first)
    if len(values):
        torch.frombuffer(out, dtype=torch.float64).copy_(values)
    return out


def append_values(column: array, values: torch.Tensor) -> None:
    """``values`` (of the array's item type) added to the end of ``column``, copied in place (the view lives only
    as long as the copy: the array can grow again after)."""
    at = len(column)
    column.frombytes(bytes(column.itemsize * len(values)))
    if len(values):
        torch.frombuffer(column, dtype=values.dtype, offset=column.itemsize * at, count=len(values)).copy_(values)
