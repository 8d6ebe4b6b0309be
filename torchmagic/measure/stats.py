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
