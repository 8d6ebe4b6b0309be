"""Order statistics for small samples of timings: median, interquartile range, and the ratio of
two contenders timed in the same rounds with its confidence interval."""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    iqr: float
    min: float
    max: float

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(samples: list[float]) -> Summary | None:
    if not samples:
        return None
    if len(samples) >= 2:
        q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
        iqr = q3 - q1
    else:
        iqr = 0.0
    return Summary(len(samples), statistics.median(samples), iqr, min(samples), max(samples))


@dataclass(frozen=True)
class PairedRatio:
    """How many times larger one contender's figure is than another's, from rounds that ran both."""

    estimate: float                   # the median of the per-round ratios
    ci: tuple[float, float] | None    # None with fewer than min_pairs(confidence) rounds (blocks, where given)
    confidence: float | None          # the interval's exact coverage, at least the one asked for
    pairs: int
    blocks: int | None = None         # the blocks of rounds the interval was made over; None: over the rounds


def paired_ratio(numerator: list[float], denominator: list[float], *, confidence: float = 0.95,
                 blocks: list[int] | None = None) -> PairedRatio:
    """The median of ``numerator[i] / denominator[i]`` and a distribution-free confidence interval
    for the true median ratio.

    Round i ran both back to back, so a load that comes and goes scales both and cancels in their
    ratio, which a ratio of the two medians does not do.  The interval is a pair of order statistics
    of the ratios: with n independent rounds, the number of ratios below the true median is
    Binomial(n, 1/2), whatever the timing noise's distribution, so the coverage is exact (and
    is reported); no resampling, no normality.  At 95% it needs 6 rounds.

    With ``blocks`` (the lengths of consecutive blocks of rounds), the interval is the same pair of order
    statistics taken of the blocks' own median ratios instead: rounds of one run share what a run fixes
    (the allocator's state, what ran before), so their interval holds that run's ratio, where the
    blocks' (each started afresh) holds the ratio runs scatter around.  It needs 6 blocks; the estimate
    stays the median over all rounds, and the interval is widened to hold it where needed.
    """
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError("need the same, non-zero number of rounds on both sides")
    if not all(x > 0 for x in denominator) or not all(x >= 0 for x in numerator):
        raise ValueError("ratios of positive figures only")
    if blocks is not None and (sum(blocks) != len(numerator) or min(blocks, default=0) < 1):
        raise ValueError("blocks must be positive lengths that add up to the rounds")
    per_round = [a / b for a, b in zip(numerator, denominator)]
    ratios = sorted(per_round)
    estimate = statistics.median(ratios)
    if blocks is not None:
        ends = list(itertools.accumulate(blocks))
        ratios = sorted(statistics.median(per_round[end - length:end]) for end, length in zip(ends, blocks))
    n = len(ratios)
    k = _outer_order_statistics(n, confidence)
    if k is None:
        return PairedRatio(estimate, None, None, len(per_round), len(ratios) if blocks is not None else None)
    low, high = ratios[k], ratios[n - 1 - k]
    return PairedRatio(estimate, (min(low, estimate), max(high, estimate)), _coverage(n, k), len(per_round),
                       n if blocks is not None else None)


def min_pairs(confidence: float = 0.95) -> int:
    """The fewest rounds that give a distribution-free interval at ``confidence``."""
    n = 1
    while _outer_order_statistics(n, confidence) is None:
        n += 1
    return n


def _coverage(n: int, k: int) -> float:
    """P(ratios[k] <= true median <= ratios[n-1-k]) for n independent ratios (0-based k)."""
    return 1 - 2 * sum(_half_binomial(n, i) for i in range(k + 1))


def _outer_order_statistics(n: int, confidence: float) -> int | None:
    """The largest k whose interval [ratios[k], ratios[n-1-k]] still covers with ``confidence``:
    the binomial tail P(X <= k) grows with k, so add terms until 2 × tail passes 1 - confidence."""
    tail, best = 0.0, None
    for k in range(n // 2):
        tail += _half_binomial(n, k)
        if 2 * tail > 1 - confidence:
            break
        best = k
    return best


def _half_binomial(n: int, k: int) -> float:
    """P(X = k) for X ~ Binomial(n, 1/2), in logs: 2**-n underflows past a thousand rounds."""
    return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2))


@dataclass(frozen=True)
class UnpairedRatio:
    """How many times larger one sample's figures are than another's, from runs that were not paired
    (two profiles taken one after the other)."""

    estimate: float                   # the median of every cross ratio (Hodges-Lehmann, on a log scale)
    ci: tuple[float, float] | None    # None where the samples are too small for ``confidence``
    confidence: float | None          # the interval's exact coverage
    sizes: tuple[int, int]


EXACT_U_LIMIT = 2500  # m·n up to this: the Mann-Whitney distribution counted exactly; beyond, its normal approximation


def unpaired_ratio(numerator: list[float], denominator: list[float], *, confidence: float = 0.95) -> UnpairedRatio:
    """The ratio of two samples' typical values, with a distribution-free confidence interval.

    Every ratio ``a / b`` of a numerator figure to a denominator figure is formed; their median
    estimates the ratio, and a pair of their order statistics, chosen from the Mann-Whitney U
    distribution, bounds it: exact when one sample is the other scaled (a step that got k times
    faster), whatever the timing noise's shape.  At 95% it needs 4 figures on each side."""
    if not numerator or not denominator:
        raise ValueError("need figures on both sides")
    if not all(x > 0 for x in denominator) or not all(x > 0 for x in numerator):
        raise ValueError("ratios of positive figures only")
    ratios = sorted(a / b for a in numerator for b in denominator)
    m, n = len(numerator), len(denominator)
    k = _u_critical(m, n, confidence)
    estimate = statistics.median(ratios)
    if k is None:
        return UnpairedRatio(estimate, None, None, (m, n))
    coverage = 1 - 2 * _u_cdf(m, n, k - 1)
    return UnpairedRatio(estimate, (ratios[k - 1], ratios[m * n - k]), coverage, (m, n))


def _u_critical(m: int, n: int, confidence: float) -> int | None:
    """The largest k ≥ 1 with 2·P(U ≤ k-1) ≤ 1 - confidence: the interval is the k-th smallest to the
    k-th largest cross ratio."""
    alpha = 1 - confidence
    if m * n > EXACT_U_LIMIT:  # the normal approximation, with a continuity correction
        z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
        k = math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12) + 0.5)
        return k if k >= 1 else None
    best = None
    for k in range(1, m * n // 2 + 1):
        if 2 * _u_cdf(m, n, k - 1) > alpha:
            break
        best = k
    return best


def _u_cdf(m: int, n: int, u: int) -> float:
    """P(U ≤ u) for the Mann-Whitney U of samples of m and n with no difference between them."""
    return sum(_u_counts(m, n)[: u + 1]) / math.comb(m + n, m)


@functools.lru_cache(maxsize=64)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) orderings give each value of U (0 to m·n), by the recurrence
    N(i, j, u) = N(i-1, j, u-j) + N(i, j-1, u): the largest value is either the first sample's (it
    beats all j others) or the second's; row by row, so no recursion."""
    previous = [[1] for _ in range(n + 1)]  # i = 0: one ordering, U = 0
    for i in range(1, m + 1):
        row = [[1]]  # j = 0
        for j in range(1, n + 1):
            counts = [0] * (i * j + 1)
            for u, c in enumerate(previous[j]):
                counts[u + j] += c
            for u, c in enumerate(row[j - 1]):
                counts[u] += c
            row.append(counts)
        previous = row
    return tuple(previous[n])


# One-sided 95% quantiles of Student's t by degrees of freedom; past 30, the Cornish-Fisher expansion
# about the normal's 1.6449 (within 0.1% there)
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def t95(df: int) -> float:
    """The one-sided 95% quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.6449
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def upper_prediction_bound(samples: list[float]) -> float:
    """The upper 95% prediction bound for one more sample from the distribution ``samples`` came from
    (normal): mean + t(n-1) * sd * sqrt(1 + 1/n).  With fewer than three samples their spread says
    too little (t(1) is 6.3): the largest."""
    n = len(samples)
    if n < 3:
        return max(samples)
    return statistics.mean(samples) + t95(n - 1) * statistics.stdev(samples) * math.sqrt(1 + 1 / n)


def upper_line_prediction_bound(points: list[tuple[float, float]], x: float) -> float | None:
    """The upper 95% prediction bound, at ``x``, for one more y from the least-squares line through
    ``points`` (x, y) (normal errors): y(x) + t(n-2) * s * sqrt(1 + 1/n + (x - mean x)^2 / Sxx).
    None with fewer than four points or two distinct x: too little to fit a line and its spread."""
    n = len(points)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if n < 4 or len(set(xs)) < 2:
        return None
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((v - mean_x) ** 2 for v in xs)
    slope = sum((u - mean_x) * (v - mean_y) for u, v in zip(xs, ys)) / sxx
    fitted = mean_y + slope * (x - mean_x)
    s = math.sqrt(sum((v - mean_y - slope * (u - mean_x)) ** 2 for u, v in zip(xs, ys)) / (n - 2))
    return fitted + t95(n - 2) * s * math.sqrt(1 + 1 / n + (x - mean_x) ** 2 / sxx)
