"""Errors of a variant's output against eager's, for the shapes outputs come in."""

import math
import warnings
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch

from torchmagic.features.compare.numerics import TOLERANCES, compare, reference, tolerance


def test_tensor_error_is_relative_to_the_largest_baseline_value():
    base = torch.tensor([10.0, 0.001, -2.0])
    err = compare(base + torch.tensor([0.1, 0.001, 0.0]), reference(base), rtol=0.02, atol=0.0)
    assert err.max_abs == pytest.approx(0.1, rel=1e-5) and err.max_rel == pytest.approx(0.01, rel=1e-5)
    assert err.ok  # the tiny element's 100% error is judged against the output's scale
    assert not compare(base * 1.05, reference(base), rtol=0.02, atol=0.0).ok


def test_nested_structures_are_compared_leaf_by_leaf():
    Pair = namedtuple("Pair", "logits aux")

    @dataclass
    class Out:
        loss: float
        parts: dict

    def make(scale):
        return Out(loss=1.5 * scale, parts={"a": Pair(torch.ones(2, 3) * scale, [torch.zeros(1), 3]), "name": "x"})

    ref = reference(make(1.0))
    assert [name for name, _ in ref.leaves] == [".loss", ".parts['a'].logits", ".parts['a'].aux[0]",
                                                ".parts['a'].aux[1]"]
    assert ref.skipped == 1  # the string
    err = compare(make(1.01), ref, rtol=0.0, atol=0.0)
    assert err.max_abs == pytest.approx(0.015) and not err.ok
    assert compare(make(1.0), ref, rtol=0.0, atol=0.0).ok


def test_mismatches_are_explained():
    ref = reference({"a": torch.ones(3)})
    assert "shape (4,)" in compare({"a": torch.ones(4)}, ref, 1, 1).problem
    assert "structure differs" in compare({"b": torch.ones(3)}, ref, 1, 1).problem
    assert math.isinf(compare([torch.ones(3)], ref, 1, 1).max_abs)


def test_non_finite_values():
    ref = reference(torch.tensor([1.0, math.inf, math.nan]))
    assert compare(torch.tensor([1.0, math.inf, math.nan]), ref, 0, 0).ok  # the same specials agree
    err = compare(torch.tensor([1.0, 2.0, math.nan]), ref, 0.5, 0)
    assert math.isinf(err.max_abs) and not err.ok


def test_low_precision_and_odd_tensors_are_compared_in_float64():
    base = torch.randn(64, 64)
    err = compare(base.bfloat16(), reference(base), *tolerance("bf16"))
    assert 0 < err.max_rel < 2 ** -8 and err.ok
    assert compare(base.to_sparse(), reference(base), 0, 0).ok
    with warnings.catch_warnings():  # quantized tensors are deprecated, yet older models return them
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(base, 0.05, 0, torch.qint8)
    assert compare(q, reference(base), *tolerance("int8")).max_rel > 0


def test_nothing_numeric_means_no_reference_and_cycles_end():
    assert reference("text") is None and reference(None) is None and reference([]) is None
    loop = []
    loop.append(loop)
    assert reference(loop) is None


def test_tolerance_table_and_overrides():
    assert tolerance("bf16") == TOLERANCES["bf16"]
    assert tolerance("bf16", rtol=0.5) == (0.5, TOLERANCES["bf16"][1])
    assert tolerance("fp32", atol=0.0) == (TOLERANCES["fp32"][0], 0.0)
