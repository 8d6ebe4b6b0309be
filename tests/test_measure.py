"""Statistics and timing primitives."""

import pytest
import torch

from torchmagic.devices import CpuDevice
from torchmagic.measure import bootstrap_ratio_ci, summarize, timed_call

from .fakes import FakeCudaDevice


def test_summary_median_and_iqr():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median == 3.0 and s.min == 1.0 and s.max == 100.0
    assert s.iqr == pytest.approx(2.0)
    assert summarize([]) is None and summarize([5.0]).iqr == 0.0


def test_bootstrap_ci_brackets_the_ratio_and_shrinks_with_agreement():
    base = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98]
    faster = [b / 2 for b in base]  # exactly 2x in every round
    low, high = bootstrap_ratio_ci(base, faster)
    assert low == pytest.approx(2.0) and high == pytest.approx(2.0)
    noisy = [f * k for f, k in zip(faster, [1.3, 0.8, 1.1, 0.9, 1.2, 0.85, 1.0, 1.05])]
    low, high = bootstrap_ratio_ci(base, noisy)
    assert low < 2.0 < high


def test_bootstrap_ci_needs_paired_rounds():
    with pytest.raises(ValueError):
        bootstrap_ratio_ci([1.0, 2.0], [1.0])


def test_timed_call_waits_for_the_device_around_the_call():
    dev = FakeCudaDevice()
    value, seconds = timed_call(lambda: torch.ones(2).sum().item(), dev)
    assert value == 2.0 and seconds >= 0 and dev.syncs == 2
    assert timed_call(lambda: 1, CpuDevice())[0] == 1
