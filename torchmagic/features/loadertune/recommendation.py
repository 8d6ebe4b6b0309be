"""Which DataLoader settings loadertune recommends, from the batches/s of the rounds that ran them
side by side: each setting's speedup over the current settings with its 95% CI, the fastest
measured, and the one to use (faster with 95% confidence, the simplest of the equally fast)."""

from __future__ import annotations

from ...core.measure import paired_ratio
from .options import MIN_PAIRED_ROUNDS
from .result import DATALOADER_DEFAULTS, LoaderRow, LoaderSettings


def _paired(samples: dict, stages: list[list[LoaderSettings]], top: LoaderSettings, base: LoaderSettings):
    """Speedup of ``top`` over ``base`` (the median of their per-round batches/s ratios) and its
    95% CI, over the rounds that ran them side by side, in every stage that ran both.  The interval
    needs MIN_PAIRED_ROUNDS paired rounds in each of those stages: fewer --rounds give none."""
    a: list[float] = []
    b: list[float] = []
    enough = True
    for stage, settings in enumerate(stages):
        if top in settings and base in settings:
            x, y = samples.get((stage, top), []), samples.get((stage, base), [])
            n = min(len(x), len(y))
            a += x[:n]
            b += y[:n]
            enough = enough and n >= MIN_PAIRED_ROUNDS
    if len(a) < 2:
        return None, None
    ratio = paired_ratio(a, b)
    return ratio.estimate, (ratio.ci if enough else None)


def vs_current(current: LoaderSettings, rows: dict[LoaderSettings, LoaderRow],
               stages: list[list[LoaderSettings]], samples: dict) -> None:
    """Each row's speedup over the current settings and its 95% CI, as the table shows them."""
    for s, row in rows.items():
        if s != current and row.error is None:
            row.speedup, row.ci = _paired(samples, stages, s, current)


def fastest_measured(current: LoaderSettings, rows: dict[LoaderSettings, LoaderRow],
                     stages: list[list[LoaderSettings]], samples: dict) -> LoaderSettings:
    """The settings with the highest speedup over the current ones (the table's "× current"), or the
    current settings when none measured faster.  Not by median batches/s: the current settings run in
    every stage and the others in one, so a load that changed between stages could make a slower
    setting's median the highest.  With the current settings failing, the highest median."""
    measured = [s for s, row in rows.items() if row.error is None and row.batches_per_s]
    now = rows.get(current)
    if now is None or now.error is not None or not now.batches_per_s:
        return max(measured, key=lambda s: rows[s].median_batches_per_s) if measured else current
    speedups = {s: _paired(samples, stages, s, current)[0] for s in measured if s != current}
    faster = {s: x for s, x in speedups.items() if x is not None and x > 1}
    return max(faster, key=faster.get) if faster else current


def recommend(current: LoaderSettings, rows: dict[LoaderSettings, LoaderRow],
              stages: list[list[LoaderSettings]], samples: dict
              ) -> tuple[LoaderSettings, float | None, tuple[float, float] | None]:
    """The settings to use, always ones that were measured, with their speedup over the current
    settings and its CI.  Among the settings faster than the current ones with 95% confidence:
    the one with the highest speedup over them, or a simpler one it is not faster than with 95%
    confidence.  None surely faster: the current settings, with the figures of the table's fastest
    (none when that is the current settings).  The view words its headline from these rules."""
    fastest = fastest_measured(current, rows, stages, samples)
    if rows[current].error is not None:  # what works beats what fails
        return fastest, None, None
    faster = {}
    for s, row in rows.items():
        if s != current and row.error is None and row.batches_per_s:
            speedup, ci = _paired(samples, stages, s, current)
            if ci is not None and ci[0] > 1:
                faster[s] = (speedup, ci)
    if not faster:
        return (current, None, None) if fastest == current else (current, *_paired(samples, stages, fastest, current))
    top = max(faster, key=lambda s: faster[s][0])  # as fastest_measured ranks them
    for s in sorted(faster, key=_complexity):
        if _complexity(s) >= _complexity(top):
            break
        _, top_over_s = _paired(samples, stages, top, s)
        if top_over_s is not None and top_over_s[0] <= 1:
            return (s, *faster[s])
    return (top, *faster[top])


def _complexity(s: LoaderSettings) -> int:
    """How many arguments differ from DataLoader's defaults: fewer is simpler to keep."""
    return sum(v is not None and DATALOADER_DEFAULTS.get(k) != v for k, v in s.kwargs().items())
