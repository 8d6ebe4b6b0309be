"""Statistics and timing primitives."""

import pytest
import torch

from torchmagic.core.devices import CpuDevice
from torchmagic.core.measure import bootstrap_ratio_ci, summarize, timed_call

from ..fakes import FakeCudaDevice


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


def test_bootstrap_ci_covers_the_true_ratio_about_95_percent_of_the_time():
    """Honest intervals: over many simulated comparisons with drift shared within a round and
    independent noise per run, the 95% CI holds the true ratio (2.0) at least ~93% of the time."""
    import random

    rng = random.Random(7)
    hits, trials = 0, 300
    for _ in range(trials):
        drift = [rng.lognormvariate(0, 0.2) for _ in range(10)]
        slow = [d * rng.lognormvariate(0, 0.05) for d in drift]
        fast = [0.5 * d * rng.lognormvariate(0, 0.05) for d in drift]
        low, high = bootstrap_ratio_ci(slow, fast, resamples=1000, seed=rng.randrange(1 << 30))
        hits += low <= 2.0 <= high
    assert 0.93 <= hits / trials <= 1.0


def test_rounds_interleave_rotate_and_drop_a_failing_contender():
    from torchmagic.core.measure import Rounds

    order = []

    def contender(name, fail_at=None):
        def block():
            order.append(name)
            if fail_at is not None and order.count(name) == fail_at:
                raise RuntimeError("broken")
            return 0.001, 2
        return block

    errors = []
    rounds = Rounds([contender("a"), contender("b"), contender("c", fail_at=3)], rounds=4)
    samples = rounds.run(on_error=lambda i, exc: errors.append((i, str(exc))))
    assert order[:9] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # each round starts one later
    assert errors == [(2, "broken")] and len(samples[2]) == 2
    assert samples[0] == [0.0005] * 4 and rounds.done == 4


def test_rounds_stop_on_min_time_after_min_rounds():
    from torchmagic.core.measure import Rounds, calls_per_block

    rounds = Rounds([lambda: (0.01, 1), lambda: (0.03, 1)], min_time=0.095, min_rounds=3)
    rounds.run()
    assert rounds.done == 10  # the faster contender needs 10 blocks of 10 ms
    assert calls_per_block(1e-5) == 100 and calls_per_block(0.5) == 1 and calls_per_block(0) == 1


def test_timed_block_syncs_only_at_its_ends():
    from torchmagic.core.measure import timed_block

    dev = FakeCudaDevice()
    calls = []
    seconds = timed_block(lambda: calls.append(1), 5, dev)
    assert len(calls) == 5 and dev.syncs == 2 and seconds >= 0
