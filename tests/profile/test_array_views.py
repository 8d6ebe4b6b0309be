"""array_views: arrays and tensors over the same values, as the traces' columns and the interval sets use them."""

from __future__ import annotations

from array import array

import pytest
import torch

from torchmagic.features.profile.array_views import append_values, doubles, tensor_view


@pytest.mark.parametrize("typecode, dtype", [("d", torch.float64), ("q", torch.long), ("i", torch.int32)])
def test_a_view_shares_the_arrays_values(typecode, dtype):
    values = array(typecode, [3, 1, 2])
    view = tensor_view(values, dtype)
    assert view.tolist() == [3, 1, 2] and view.dtype == dtype
    view[0] = 7  # the same memory: written through
    assert values[0] == 7
    del view
    values.append(4)  # the array grows again once the view is gone


def test_an_empty_array_gives_an_empty_tensor():
    view = tensor_view(array("q"), torch.long)
    assert view.shape == (0,) and view.dtype == torch.long


def test_doubles_copies_a_tensor_into_a_new_array():
    values = torch.tensor([0.5, -1.25, 1e300, float("inf")], dtype=torch.float64)
    out = doubles(values[1:])  # a view that does not start at its storage's start
    assert out.typecode == "d" and out.tolist() == [-1.25, 1e300, float("inf")]
    values[1] = 0.0
    assert out[0] == -1.25  # a copy
    assert doubles(torch.empty(0, dtype=torch.float64)) == array("d")


@pytest.mark.parametrize("typecode, dtype", [("q", torch.long), ("d", torch.float64)])
def test_appended_values_follow_what_the_array_held(typecode, dtype):
    column = array(typecode, [1, 2])
    append_values(column, torch.tensor([5, 6, 7], dtype=dtype)[::2])  # strided: copied as the values read
    append_values(column, torch.empty(0, dtype=dtype))
    assert column.tolist() == [1, 2, 5, 7]
    column.append(8)  # no view of it outlives the copy
    assert column[-1] == 8
