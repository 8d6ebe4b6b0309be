"""Statistics and timing primitives."""

import os
import time

import pytest
import torch

from torchmagic.core.devices import CpuDevice
from torchmagic.core.measure import min_pairs, paired_ratio, summarize, timed_call

from ..fakes import FakeCudaDevice
from ..processes import busy_cores


def test_summary_median_and_iqr():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median == 3.0 and s.min == 1.0 and s.max == 100.0
    assert s.iqr == pytest.approx(2.0)
    assert summarize([]) is None and summarize([5.0]).iqr == 0.0


def test_paired_ratio_is_the_median_per_round_ratio_within_its_interval():
    base = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98]
    faster = [b / 2 for b in base]  # exactly 2x in every round, whatever the round's load
    r = paired_ratio(base, faster)
    assert r.estimate == pytest.approx(2.0) and r.ci == pytest.approx((2.0, 2.0)) and r.pairs == 8
    noisy = [f * k for f, k in zip(faster, [1.3, 0.8, 1.1, 0.9, 1.2, 0.85, 1.0, 1.05])]
    r = paired_ratio(base, noisy)
    assert r.ci[0] < r.estimate < r.ci[1] and r.ci[0] < 2.0 < r.ci[1]


def test_paired_ratio_intervals_are_order_statistics_with_their_exact_coverage():
    # ratios 1..n: the interval is the (k+1)-th smallest and largest, k from Binomial(n, 1/2)
    assert min_pairs() == 6 and min_pairs(0.99) == 8
    r = paired_ratio([1.0, 2.0, 3.0, 4.0, 5.0], [1.0] * 5)
    assert r.ci is None and r.confidence is None and r.estimate == 3.0  # 5 rounds: at most 1 - 2/32 = 93.75%
    r = paired_ratio([float(i) for i in range(1, 7)], [1.0] * 6)
    assert r.ci == (1.0, 6.0) and r.confidence == pytest.approx(1 - 2 / 64)
    r = paired_ratio([float(i) for i in range(1, 11)], [1.0] * 10)
    assert r.ci == (2.0, 9.0) and r.confidence == pytest.approx(1 - 2 * 11 / 1024)
    r = paired_ratio([float(i) for i in range(1, 5001)], [1.0] * 5000)  # thousands of rounds: no overflow
    assert 0.95 <= r.confidence < 0.96 and r.ci[0] < 2500.5 < r.ci[1] and r.ci[1] - r.ci[0] < 160


def test_paired_ratio_over_blocks_takes_the_order_statistics_of_the_blocks_medians():
    rounds = [1.0, 1.0, 2.0, 2.2, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.2]  # ratios over 1.0
    r = paired_ratio(rounds, [1.0] * 12, blocks=[2] * 6)
    assert r.ci == pytest.approx((1.0, 6.1)) and r.confidence == pytest.approx(1 - 2 / 64)
    assert r.blocks == 6 and r.pairs == 12 and r.estimate == 3.5  # the estimate: the median over all rounds
    assert paired_ratio(rounds, [1.0] * 12).ci == (2.0, 5.0)  # the same rounds taken one by one
    five = paired_ratio(rounds, [1.0] * 12, blocks=[2, 2, 2, 2, 4])
    assert five.ci is None and five.blocks == 5 and five.estimate == 3.5  # 5 blocks: no 95% interval
    # blocks of unequal length can put every block's median on one side of the rounds' median: widened to hold it
    uneven = paired_ratio([1.0] * 9 + [9.0] * 8, [1.0] * 17, blocks=[9] + [1] * 8)
    assert uneven.estimate == 1.0 and uneven.ci == (1.0, 9.0)  # the blocks' alone: (9.0, 9.0)
    for bad in ([2] * 5, [2] * 5 + [1, 1, 0]):
        with pytest.raises(ValueError):
            paired_ratio(rounds, [1.0] * 12, blocks=bad)


def test_an_interval_over_blocks_holds_a_ratio_that_moves_from_run_to_run():
    """What a run fixes for all its rounds (where its tensors landed, what ran before) moves its ratio, 3%
    here, more than its rounds vary (1%): an interval over one run's rounds holds that run's ratio, not the
    one runs scatter around; over blocks that each start afresh (each draws its own), it holds that one."""
    import random

    rng = random.Random(11)
    trials, over_rounds, over_blocks = 2000, 0, 0
    for _ in range(trials):
        slow, fast = [], []
        for _ in range(6):
            fresh = rng.lognormvariate(0, 0.03)  # this block's start fixes it
            for _ in range(4):
                load = rng.lognormvariate(0, 0.2)  # shared within a round: cancels in the ratio
                slow.append(2.0 * fresh * load * rng.lognormvariate(0, 0.01))
                fast.append(load * rng.lognormvariate(0, 0.01))
        one_by_one = paired_ratio(slow, fast).ci
        by_block = paired_ratio(slow, fast, blocks=[4] * 6).ci
        over_rounds += one_by_one[0] <= 2.0 <= one_by_one[1]
        over_blocks += by_block[0] <= 2.0 <= by_block[1]
    assert over_blocks / trials >= 0.95 and over_rounds / trials < 0.9  # 97% and 82%


def test_paired_ratio_needs_paired_positive_rounds():
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_ratio([1.0], [0.0])


def test_timed_call_waits_for_the_device_around_the_call():
    dev = FakeCudaDevice()
    value, seconds = timed_call(lambda: torch.ones(2).sum().item(), dev)
    assert value == 2.0 and seconds >= 0 and dev.syncs == 2
    assert timed_call(lambda: 1, CpuDevice())[0] == 1


def _timings(rng, rounds, scenario):
    """Simulated times of a contender twice as slow as another (true ratio 2) under one noise model:
    each run is scaled by lognormal jitter, and 10% of runs by an exponential outlier; "drift" adds
    a load shared within a round that wanders and steps up at a random round; "switching" a load
    that turns on and off between any two runs, so a round can straddle a switch."""
    def jitter():
        return rng.lognormvariate(0, 0.05) * (1 + rng.expovariate(1) if rng.random() < 0.1 else 1)

    slow_load, fast_load = [1.0] * rounds, [1.0] * rounds
    if scenario == "drift":
        level, step_at = 1.0, rng.randrange(rounds)
        for i in range(rounds):
            level *= rng.lognormvariate(0, 0.08)
            slow_load[i] = fast_load[i] = level * (1.7 if i >= step_at else 1.0)
    elif scenario == "switching":
        on = False
        for i in range(rounds):
            loads = []
            for _ in range(2):
                on ^= rng.random() < 0.15
                loads.append(1.8 if on else 1.0)
            slow_load[i], fast_load[i] = loads if rng.random() < 0.5 else loads[::-1]
    slow = [2.0 * slow_load[i] * jitter() for i in range(rounds)]
    fast = [1.0 * fast_load[i] * jitter() for i in range(rounds)]
    return slow, fast


@pytest.mark.parametrize("scenario", ["jitter", "drift", "switching"])
@pytest.mark.parametrize("rounds", [6, 10, 30])
def test_the_95_percent_interval_covers_the_true_ratio_at_least_95_percent_of_the_time(scenario, rounds):
    """The guarantee, checked by simulation: 2,000 comparisons per noise model and number of rounds
    (in expectation at least 96.5% at these round counts)."""
    import random

    rng = random.Random(f"{scenario}-{rounds}")
    trials, hits = 2000, 0
    for _ in range(trials):
        r = paired_ratio(*_timings(rng, rounds, scenario))
        hits += r.ci[0] <= 2.0 <= r.ci[1]
    assert hits / trials >= 0.95


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
    from torchmagic.core.measure import Rounds, balanced_calls, calls_per_block

    rounds = Rounds([lambda: (0.01, 1), lambda: (0.03, 1)], min_time=0.095, min_rounds=3)
    rounds.run()
    assert rounds.done == 10  # the faster contender needs 10 blocks of 10 ms
    assert calls_per_block(1e-5) == 100 and calls_per_block(0.5) == 1 and calls_per_block(0) == 1
    # contenders sharing rounds: every block lasts about as long as the slowest one's call, and at least 25 ms
    assert balanced_calls([1e-5, 2e-3, 5e-2]) == [5000, 25, 1] and balanced_calls([1e-5, 1e-4]) == [2500, 250]
    assert balanced_calls([1e-3, 5.0]) == [100, 1]  # a 5 s first run (a compile, no warm-up): 0.1 s blocks at most


def test_rounds_fall_into_blocks_each_started_afresh():
    from torchmagic.core.measure import BlockStart, Rounds

    log = []

    def contender(name, seconds=0.01):
        return lambda: (log.append(name), (seconds, 1))[1]

    start = BlockStart([lambda: log.append("warm a"), lambda: log.append("warm b")], refresh=lambda: log.append("fresh"))
    rounds = Rounds([contender("a"), contender("b")], rounds=10, blocks=6, block_start=start)
    rounds.run()
    assert rounds.block_ends == [2, 3, 5, 7, 8, 10] and rounds.block_lengths(10) == [2, 1, 2, 2, 1, 2]
    assert log[:7] == ["a", "b", "b", "a", "fresh", "warm a", "warm b"] and log[-1] != "warm b"
    assert log.count("fresh") == 5 and log.count("warm a") == 5 and log.count("a") == 10
    assert rounds.block_lengths(6) == [2, 1, 2, 1]  # rounds cut short: the last block counts with what it has
    # until min_time: the first block runs min_rounds / blocks rounds and min_time / blocks seconds, the others as long
    timed = Rounds([contender("a"), contender("b", 0.03)], min_time=0.12, min_rounds=3, blocks=3)
    timed.run()
    assert timed.block_ends == [4, 8, 12] and timed.done == 12
    assert Rounds([contender("a")], min_rounds=10, blocks=6).fewest() == 12 and timed.fewest() == 3
    assert Rounds([contender("a")], rounds=4, blocks=6).blocks == 4  # never more blocks than rounds


def test_a_contender_whose_warm_up_fails_leaves_the_rotation():
    from torchmagic.core.measure import BlockStart, Rounds

    def broken():
        raise RuntimeError("broken")

    errors = []
    rounds = Rounds([lambda: (0.01, 1), lambda: (0.01, 1)], rounds=6, blocks=3,
                    block_start=BlockStart([lambda: None, broken]))
    samples = rounds.run(on_error=lambda i, exc: errors.append((i, str(exc))))
    assert errors == [(1, "broken")] and len(samples[0]) == 6 and len(samples[1]) == 2
    alone = Rounds([lambda: (0.01, 1)], rounds=6, blocks=3, block_start=BlockStart([broken]))
    alone.run(on_error=lambda i, exc: None)  # the last contender gone between blocks: the rounds end
    assert alone.done == 2


def test_timed_block_syncs_only_at_its_ends():
    from torchmagic.core.measure import timed_block

    dev = FakeCudaDevice()
    calls = []
    seconds = timed_block(lambda: calls.append(1), 5, dev)
    assert len(calls) == 5 and dev.syncs == 2 and seconds >= 0


def test_t95_is_students_one_sided_quantile_and_the_bound_covers_one_more_sample():
    from torchmagic.core.measure.stats import t95, upper_prediction_bound

    # published values at 1, 4, 30 degrees of freedom; the expansion past the table meets it at 30
    assert (t95(1), t95(4), t95(30)) == (6.314, 2.132, 1.697)
    assert t95(31) == pytest.approx(1.696, abs=2e-3) and t95(120) == pytest.approx(1.658, abs=1e-3)
    with pytest.raises(ValueError):
        t95(0)
    assert upper_prediction_bound([3.0, 5.0]) == 5.0  # two samples' spread says too little
    # a normal sample of 5, then one more: the bound holds the next one 95% of the time
    gen = torch.Generator().manual_seed(0)
    trials, held = 4000, 0
    for _ in range(trials):
        draws = (100 + 10 * torch.randn(6, generator=gen, dtype=torch.float64)).tolist()
        held += draws[5] <= upper_prediction_bound(draws[:5])
    assert 0.94 <= held / trials <= 0.96


def test_the_line_bound_covers_one_more_point_at_and_beyond_the_points():
    from torchmagic.core.measure.stats import upper_line_prediction_bound

    assert upper_line_prediction_bound([(1, 2), (1, 3), (1, 4), (1, 5)], 1) is None  # one x: no line
    assert upper_line_prediction_bound([(1, 2), (2, 3), (3, 4)], 2) is None  # three points: no spread to trust
    assert upper_line_prediction_bound([(1, 2), (2, 4), (3, 6), (4, 8)], 5) == pytest.approx(10)  # exact line
    # a line with a large intercept (a fresh process's first-use memory) and normal noise: 6 points at
    # 3 sizes, then one more at a size among them and one past them; each held 95% of the time
    gen = torch.Generator().manual_seed(0)
    trials, held = 4000, {30.0: 0, 45.0: 0}
    for _ in range(trials):
        noise = (4 * torch.randn(8, generator=gen, dtype=torch.float64)).tolist()
        xs = [20.0, 20.0, 25.0, 25.0, 30.0, 30.0]
        points = [(x, 100 + 2 * x + e) for x, e in zip(xs, noise)]
        for x, e in zip(held, noise[6:]):
            held[x] += 100 + 2 * x + e <= upper_line_prediction_bound(points, x)
    assert all(0.94 <= count / trials <= 0.96 for count in held.values()), held


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_wait_is_the_share_of_ready_time_the_threads_waited_for_a_cpu(monkeypatch):
    from torchmagic.core.measure import CpuWait

    waited = CpuWait()
    spin(0.3)
    free = waited.share()
    with busy_cores():
        waited = CpuWait()
        spin(0.3)
        busy = waited.share()
    # one thread among one busy loop per core: the scheduler shares a core between the two, about half each
    assert free is not None and 0 <= free < busy - 0.2 and busy < 1
    monkeypatch.setattr(os, "getpid", lambda: 2 ** 22 + 1)  # a process with no /proc entry: no figures, no error
    assert CpuWait().share() is None
