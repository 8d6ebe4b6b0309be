"""Order statistics for small samples of timings: median and interquartile range."""

from __future__ import annotations

import random
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


def bootstrap_ratio_ci(numerator: list[float], denominator: list[float], *, confidence: float = 0.95,
                       resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """Confidence interval of median(numerator) / median(denominator) over paired rounds.

    The samples are paired by index (round i of each, run back to back), so resampling whole
    rounds keeps what the two share (machine drift within a round) out of the interval.
    """
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError("need the same, non-zero number of rounds on both sides")
    rng = random.Random(seed)
    n = len(numerator)
    ratios = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        ratios.append(statistics.median(numerator[i] for i in picks)
                      / statistics.median(denominator[i] for i in picks))
    ratios.sort()
    tail = (1 - confidence) / 2
    return ratios[int(tail * resamples)], ratios[min(int((1 - tail) * resamples), resamples - 1)]
