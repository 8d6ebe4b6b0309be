"""How far torchmagic.compare's timings can be trusted, at its default settings.

    python -m benchmarks.compare_accuracy

1. Agreement: for fixed callables from ~20 µs to ~5 ms, the eager median of
   ``torchmagic.compare`` against ``torch.utils.benchmark.Timer.blocked_autorange`` (same thread
   count), measured alternately several times; prints ours / theirs per repetition, and beside
   it blocked_autorange against itself run right after, the noise floor of such a comparison.
2. CI width and coverage: an A/A comparison (a variant that changes nothing: the true speedup is
   1), where the interval should hold 1; and an A/B one (a variant that does the work twice, about
   0.5: the second run finds warm caches, so not exactly), for the width at a real difference.
3. Cost: the wall time of a comparison of eager and that A/B variant against blocked_autorange
   run once per variant with the same minimum time (the same information: a median per variant
   from that many seconds of timed runs); the target is at most 2x.
4. Coverage of a known ratio: a workload whose variant does exactly twice the loop iterations
   (``tests.workloads.Spinner``: true speedup 0.5), with noise and a switching load injected on
   top of the machine's own; the 95% interval should hold 0.5 in at least 90% of comparisons.
5. Between runs, on a real model (Hugging Face BERT from a small config, inference): amp, inference_mode
   and compile against eager, ``--repeats`` comparisons; after each, an independent interleaved
   estimate (``blocked_autorange`` on eager and the variant in turn, 0.1 s each, 48 times, the variant
   over its two eager neighbours).  How often each interval holds that estimate (target 9 in 10) and
   the median of all runs' such estimates (the best one of the truth), and how many pairs of the
   repeated runs' intervals overlap.  ``python -m benchmarks.compare_accuracy --between-runs``
   runs this part alone.

glibc's malloc hands freed memory at the top of the heap back to the OS and serves large
blocks with mmap, so whether a call's activations page-fault depends on what else the process
holds: the same conv forward measured 4 ms or 10-12 ms from one minute to the next here, with
any timer.  To compare two timers rather than two heap states, the script pins malloc's trim
and mmap thresholds first (as jemalloc or tcmalloc would make allocation stable).
"""

from __future__ import annotations

import argparse
import ctypes
import random
import statistics
import time

import torch
from torch import nn
from torch.utils.benchmark import Timer

from benchmarks.machine import machine_line
import torchmagic
from tests.workloads import SPIN_TWICE, Spinner, iterations_per_second
from torchmagic import Technique, Variant
from torchmagic.core.measure import PairedRatio, min_pairs, paired_ratio

REPEATS = 5


def workloads() -> dict[str, tuple]:
    torch.manual_seed(0)
    a = torch.randn(64, 64)
    mlp = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512)).eval()
    x = torch.randn(64, 512)
    conv = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1)).eval()
    image = torch.randn(8, 3, 64, 64)
    return {
        "matmul 64x64": (None, lambda: a @ a),
        "MLP forward, batch 64": (mlp, lambda m: m(x)),
        "conv forward, 8x3x64x64": (conv, lambda m: m(image)),
    }


def identity(model, env):
    return model


def twice(model, env):
    if model is None:
        return None
    return lambda *args: (model(*args), model(*args))[1]


SAME = Variant("same", (Technique("same", build=identity),))
TWICE = Variant("twice", (Technique("twice", build=twice, needs_model=True),))


def agreement(name: str, model, fn) -> tuple[list[float], list[float]]:
    """ours / theirs per repetition, and theirs / theirs (blocked_autorange run again right after):
    how much any single measurement moves here, the floor for the first figure."""
    call = (lambda: fn(model)) if model is not None else fn
    timer = Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
    ours_ratios, self_ratios = [], []
    with torch.no_grad():
        for _ in range(REPEATS):
            ours = torchmagic.compare(fn, model=model, variants="eager").baseline.median_s
            theirs = timer.blocked_autorange(min_run_time=1.0).median
            again = timer.blocked_autorange(min_run_time=1.0).median
            ours_ratios.append(ours / theirs)
            self_ratios.append(again / theirs)
    print(f"  {name:24s} ours/theirs " + " ".join(f"{r:.3f}" for r in ours_ratios)
          + f" (median {statistics.median(ours_ratios):.3f});  theirs/theirs "
          + " ".join(f"{r:.3f}" for r in self_ratios))
    return ours_ratios, self_ratios


def interval(model, fn, variant: Variant) -> tuple[float, tuple[float, float], float]:
    with torch.no_grad():
        r = torchmagic.compare(fn, model=model, variants=["eager", variant])
    v = r[variant.name]
    return v.speedup, v.ci, r.seconds


def cost(model, fn, min_time: float) -> tuple[float, float]:
    """Wall seconds of one comparison of eager and TWICE, and of blocked_autorange on each."""
    with torch.no_grad():
        start = time.perf_counter()
        torchmagic.compare(fn, model=model, variants=["eager", TWICE], min_time=min_time)
        ours = time.perf_counter() - start
        start = time.perf_counter()
        for m in (model, twice(model, None)):
            Timer(stmt="fn(m)", globals={"fn": fn, "m": m},
                  num_threads=torch.get_num_threads()).blocked_autorange(min_run_time=min_time)
        theirs = time.perf_counter() - start
    return ours, theirs


def coverage(trials: int = 100) -> tuple[int, list[float]]:
    """How many of ``trials`` comparisons' 95% intervals held the true 0.5, and their widths."""
    rng = random.Random(0)
    net = Spinner(rng, iterations_per_second())
    held, widths = 0, []
    for _ in range(trials):
        v = torchmagic.compare(lambda m: m(), model=net, variants=["eager", SPIN_TWICE], runs=10, warmup=1)["twice"]
        held += v.ci[0] <= 0.5 <= v.ci[1]
        widths.append((v.ci[1] - v.ci[0]) / v.speedup)
    return held, widths


BETWEEN_VARIANTS = ("amp", "inference_mode", "compile")
PAIRS = 48  # of the reference's interleaved blocked_autorange estimates, per variant


def bert_inference():
    from tests.corpus.models import bert

    torch.manual_seed(0)
    workload = bert()
    ids = workload.batch["input_ids"]
    return workload.model.eval(), (lambda m: m(input_ids=ids).logits)


def independent_estimates(model, fn, pairs: int = PAIRS, seconds: float = 0.1) -> dict[str, PairedRatio]:
    """Each variant's speedup by blocked_autorange, interleaved: eager, variant, eager, ... ``pairs`` times,
    each variant time against the mean of its two eager neighbours; the median of those ratios, with the
    distribution-free 95% interval of those pairs (how precise the reference itself is)."""
    compiled = torch.compile(model)
    calls = {"eager": lambda: fn(model), "compile": lambda: fn(compiled)}
    contexts = {"amp": lambda: torch.autocast("cpu", dtype=torch.bfloat16), "inference_mode": torch.inference_mode}
    for name, context in contexts.items():
        calls[name] = (lambda c: lambda: _under(c, model, fn))(context)
    timers = {name: Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
              for name, call in calls.items()}
    eagers: dict[str, list[float]] = {name: [] for name in BETWEEN_VARIANTS}
    variants: dict[str, list[float]] = {name: [] for name in BETWEEN_VARIANTS}
    for _ in range(pairs):
        eager = timers["eager"].blocked_autorange(min_run_time=seconds).median
        for name in BETWEEN_VARIANTS:
            variants[name].append(timers[name].blocked_autorange(min_run_time=seconds).median)
            after = timers["eager"].blocked_autorange(min_run_time=seconds).median
            eagers[name].append((eager + after) / 2)
            eager = after
    return {name: paired_ratio(eagers[name], variants[name]) for name in BETWEEN_VARIANTS}


def _under(context, model, fn):
    with context():
        return fn(model)


def between_runs(repeats: int, pairs: int = PAIRS) -> None:
    # Timer sets torch's thread count around every measurement, and torch.set_num_threads turns MKL's dynamic
    # threading off for the rest of the process (mkl_set_dynamic(false)): BERT's fp32 eager then ran 3-8% slower
    # here and amp's speedup read that much higher, so every comparison before the first reference timed another
    # process than the reference did.  Made once, first, the call puts both in the state the reference leaves.
    torch.set_num_threads(torch.get_num_threads())
    model, fn = bert_inference()
    with torch.no_grad():
        fn(torch.compile(model))  # the first compile in the process (inductor's loading) outside the figures
    rows = []
    for i in range(repeats):
        r = torchmagic.compare(fn, model=model, variants=["eager", *BETWEEN_VARIANTS])
        rows.append(({n: (r[n].speedup, r[n].ci) for n in BETWEEN_VARIANTS}, independent_estimates(model, fn, pairs)))
        print(f"  run {i + 1:2d}: {r.rounds} rounds in {r.blocks} blocks, {r.seconds:.1f} s; " + "; ".join(
            f"{n} {r[n].speedup:.3f} [{r[n].ci[0]:.3f}, {r[n].ci[1]:.3f}] vs {rows[-1][1][n].estimate:.3f} "
            f"[{rows[-1][1][n].ci[0]:.3f}, {rows[-1][1][n].ci[1]:.3f}]" for n in BETWEEN_VARIANTS), flush=True)
    runs_paired = repeats * (repeats - 1) // 2
    for n in BETWEEN_VARIANTS:
        cis = [ours[n][1] for ours, _ in rows]
        references = [theirs[n] for _, theirs in rows]
        their_estimates = [ref.estimate for ref in references]
        held = sum(low <= ref.estimate <= high for (low, high), ref in zip(cis, references))
        met = sum(low <= ref.ci[1] and ref.ci[0] <= high for (low, high), ref in zip(cis, references))
        pooled = statistics.median(their_estimates)
        held_pooled = sum(low <= pooled <= high for low, high in cis)
        overlapping = _overlapping_pairs(cis)
        # the same questions asked of the reference itself (pairs x 0.1 s of blocked_autorange a variant): how far the
        # machine lets any one run's interval hold between runs
        their_overlapping = _overlapping_pairs([ref.ci for ref in references])
        their_next = sum(a.ci[0] <= b.estimate <= a.ci[1] for a, b in zip(references, references[1:]))
        estimates = [ours[n][0] for ours, _ in rows]
        widths = [(high - low) / s for (low, high), s in zip(cis, estimates)]
        their_widths = [(ref.ci[1] - ref.ci[0]) / ref.estimate for ref in references]
        spread = statistics.stdev(estimates) / statistics.mean(estimates)
        their_spread = statistics.stdev(their_estimates) / statistics.mean(their_estimates)
        print(f"  {n:15s} held the interleaved estimate in {held}/{repeats} (met its own interval in {met}), their "
              f"median ({pooled:.3f}) in {held_pooled}/{repeats}; intervals overlapping in {overlapping}/{runs_paired} "
              f"pairs; run-to-run SD of the speedup {spread:.1%} (the reference's {their_spread:.1%}), median width "
              f"{statistics.median(widths):.1%} (the reference's {statistics.median(their_widths):.1%}); the "
              f"reference's own intervals overlapping in {their_overlapping}/{runs_paired} pairs, holding the next "
              f"reference's estimate in {their_next}/{repeats - 1}")


def _overlapping_pairs(intervals: list[tuple[float, float]]) -> int:
    return sum(a[0] <= b[1] and b[0] <= a[1] for i, a in enumerate(intervals) for b in intervals[i + 1:])


def pin_malloc_thresholds() -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's mallopt parameter numbers
    return bool(libc.mallopt(m_trim_threshold, 1 << 30) and libc.mallopt(m_mmap_threshold, 32 << 20))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--between-runs", action="store_true", help="part 5 alone")
    parser.add_argument("--repeats", type=int, default=10, help="comparisons in part 5 (default 10)")
    parser.add_argument("--pairs", type=int, default=PAIRS,
                        help=f"interleaved pairs in part 5's reference estimate (default {PAIRS})")
    args = parser.parse_args()
    if args.pairs < min_pairs():
        parser.error(f"--pairs: at least {min_pairs()} (the reference's own 95% interval needs them)")
    if args.between_runs:  # as a notebook runs: torch's thread count and malloc as they are
        print(f"{machine_line()}; {torch.get_num_threads()} threads (set once first, as Timer does), malloc as it is")
        print(f"\n5. between runs: BERT inference, {args.repeats} comparisons at default settings, each followed by "
              "an interleaved blocked_autorange estimate")
        between_runs(args.repeats, args.pairs)
        return
    torch.set_num_threads(1)  # two threads on two busy cores make every timing tool noisy
    pinned = pin_malloc_thresholds()
    print(f"{machine_line()}; malloc thresholds {'pinned' if pinned else 'as they are (not glibc)'}")
    print(f"\n1. eager median, torchmagic.compare (defaults: ≥10 rounds, ≥1 s) vs blocked_autorange "
          f"(min_run_time=1 s), {REPEATS} alternating repetitions")
    ours_all, self_all = [], []
    for name, (model, fn) in workloads().items():
        ours, again = agreement(name, model, fn)
        ours_all += ours
        self_all += again

    def spread(ratios):
        worst = max(ratios, key=lambda r: abs(r - 1))
        return f"median {statistics.median(ratios):.3f}, worst {worst:.3f} ({abs(worst - 1):.1%} apart)"

    print(f"  all: ours/theirs {spread(ours_all)}; blocked_autorange against itself {spread(self_all)}")

    print(f"\n2. 95% CI of the speedup at default settings, {REPEATS} comparisons each")
    for name, (model, fn) in workloads().items():
        if model is None:
            continue
        for variant in (SAME, TWICE):
            rows = [interval(model, fn, variant) for _ in range(REPEATS)]
            widths = [(high - low) / speedup for speedup, (low, high), _ in rows]
            line = (f"  {name:24s} {variant.name:5s}: speedup {statistics.median(s for s, _, _ in rows):.3f}, "
                    f"CI width {statistics.median(widths):.1%} of it (median; max {max(widths):.1%}), "
                    f"{statistics.median(t for _, _, t in rows):.1f} s per comparison")
            if variant is SAME:
                line += f"; held 1.0 in {sum(low <= 1 <= high for _, (low, high), _ in rows)}/{REPEATS}"
            print(line)

    print(f"\n3. wall time of one comparison (eager and twice) / blocked_autorange on each, same minimum "
          f"time per variant, median of {REPEATS}; target at most 2x")
    for name, (model, fn) in workloads().items():
        if model is None:
            continue
        for min_time in (0.2, 1.0):
            runs = [cost(model, fn, min_time) for _ in range(REPEATS)]
            ratios = [ours / theirs for ours, theirs in runs]
            print(f"  {name:24s} {min_time:.1f} s: {statistics.median(o for o, _ in runs):.2f} s against "
                  f"{statistics.median(t for _, t in runs):.2f} s, ratio {statistics.median(ratios):.2f} "
                  f"(max {max(ratios):.2f})")

    trials = 100
    held, widths = coverage(trials)
    print(f"\n4. known ratio 0.5 (loop iterations, injected noise and load), 10 rounds per comparison: the 95% "
          f"interval held it in {held}/{trials} comparisons; median width {statistics.median(widths):.1%} "
          f"of the speedup")


if __name__ == "__main__":
    main()
