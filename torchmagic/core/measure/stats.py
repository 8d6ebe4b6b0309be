"""Order statistics for small samples of timings: median and interquartile range."""

from __future__ import annotations

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
    """Percentile-bootstrap confidence interval of median(numerator) / median(denominator).

    The samples are paired by index (round i of each, run back to back), so resampling whole
    rounds keeps what the two share (machine drift within a round) out of the interval.
    """
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError("need the same, non-zero number of rounds on both sides")
    import torch  # stats stays importable without torch for the summary alone

    generator = torch.Generator().manual_seed(seed)
    n = len(numerator)
    picks = torch.randint(0, n, (resamples, n), generator=generator)
    top = torch.tensor(numerator, dtype=torch.float64)[picks].quantile(0.5, dim=1)
    bottom = torch.tensor(denominator, dtype=torch.float64)[picks].quantile(0.5, dim=1)
    ratios = (top / bottom).sort().values
    tail = (1 - confidence) / 2
    return float(ratios[int(tail * resamples)]), float(ratios[min(int((1 - tail) * resamples), resamples - 1)])
