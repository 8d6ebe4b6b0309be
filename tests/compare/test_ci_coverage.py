"""The speedup's 95% interval keeps its promise through the real engine: on a workload whose true
ratio is known, with noise and load injected, it holds the truth at least 90% of the time."""

import gc
import os
import random
import statistics
import pytest

import torchmagic

from ..workloads import SPIN_TWICE, Spinner, iterations_per_second


@pytest.mark.slow
def test_the_interval_holds_a_known_ratio_at_least_90_percent_of_the_time():
    """Coverage is a proportion, so it is judged in stages: 36 hits in 40 trials passes; fewer, and the
    trials go on to 120 (108 hits pass), then to 300 (270).  The intervals' nominal coverage is 96.9% (six
    blocks); measured on the AVX512 EPYC: 115 of 120 quiet (95.8%), and with one untimed call and shorter
    blocks 97.8% quiet and 94-99% with three bursty CPU hogs.  Binomial sums (the stages run under the same
    load, so a load that lowers coverage lowers it in all): at 95% the test fails once in about 26,000 runs,
    at 93% once in 150, and it passes an interval that covers 85% 29% of the time, 88% 57% (one stage of 60
    failed 3% of runs at 95%, as one CI run under load did).  A trial takes ~1 s (blocks of 25 ms after 10 ms
    of untimed calls), so the first stage is 40 trials, not 60."""
    rng, rate = random.Random(0), iterations_per_second()
    net = Spinner(rng, rate)
    estimates, misses = [], []
    for trials, needed in ((40, 36), (120, 108), (300, 270)):
        while len(estimates) < trials:
            r = torchmagic.compare(lambda m: m(), model=net, variants=["eager", SPIN_TWICE], runs=10, warmup=1)
            twice = r["twice"]
            assert twice.ci[0] <= twice.speedup <= twice.ci[1]
            estimates.append(twice.speedup)
            if not twice.ci[0] <= 0.5 <= twice.ci[1]:
                misses.append((round(twice.speedup, 3), tuple(round(c, 3) for c in twice.ci)))
        if trials - len(misses) >= needed:
            return
    above = sum(speedup > 0.5 for speedup, _ in misses)
    pytest.fail(f"covered 0.5 in {trials - len(misses)} of {trials} (median estimate "
                f"{statistics.median(estimates):.4f}; {above} of the {len(misses)} misses above 0.5; load average "
                f"{os.getloadavg()[0]:.1f}; spin rate {iterations_per_second() / rate:.2f}x the start's); "
                f"missed: {misses}")


def test_timed_runs_and_the_peak_run_pause_the_cycle_collector_and_nothing_collects():
    rng, rate = random.Random(1), iterations_per_second()
    net = Spinner(rng, rate)
    collected = []
    callbacks = gc.callbacks
    callbacks.append(lambda phase, info: collected.append(info["generation"]) if phase == "start" else None)
    try:
        was = gc.isenabled()
        r = torchmagic.compare(lambda m: m(), model=net, variants=["eager", SPIN_TWICE], runs=8, warmup=2)
    finally:
        callbacks.pop()
    assert gc.isenabled() == was
    # eager runs: first, 2 warm-up, peak, 8 timed blocks each led by untimed calls (10 ms of them: about 5), and an
    # untimed run before each block of rounds but the first (8 rounds in 6 blocks: 5); the first, warm-ups and those
    # with the collector on, the blocks, their lead-ins and the peak's off.  Calls per block and lead-in: sized by the
    # fastest run's time (a stall can make it look slower), so only counted here
    calls = r.baseline.calls_per_sample
    assert calls >= 1 and r.blocks == 6
    blocks_and_lead_ins = len(net.gc_enabled) - (1 + 2 + 1 + 5)
    assert blocks_and_lead_ins % 8 == 0 and blocks_and_lead_ins // 8 > calls and net.gc_enabled[:3] == [was] * 3
    assert net.gc_enabled[3:].count(True) == (5 if was else 0)
    assert 2 not in collected  # no full collection was asked for (one costs ~150 ms in a large process)
    assert r.rounds == 8
