"""The batch-size search behind ``%autobatch``: predict from a fitted memory law, then verify.

Pure logic over a ``probe``: a callable that runs (or estimates) one step at a batch size
and reports its peak memory.  It never touches a device itself, so it is tested with
probes that follow known memory laws, and the real probes (CPU, CUDA, fake tensors)
plug in unchanged.

The search:

1. *Fit.*  Where the probe can estimate (fake tensors: no memory used), calibrated estimates
   bracket the limit closely and the line through the bracket's ends is the law (where a run's
   footprint grows with torch's allocations, as a CPU process's resident memory does, a real
   run halfway to the answer scales them first); else real runs
   at small sizes that grow, ever faster while the peak stays flat (allocator blocks), give
   ``peak(bs) = fixed + per_sample * bs``.
2. *Predict* the largest multiple of ``multiple_of`` whose fitted peak stays under
   ``limit = budget * (1 - margin)``.
3. *Verify* with real runs.  While runs succeed, refit on the real points and move up to the
   new prediction (at least one step, so a law that bends down is followed); after the first
   failure, home in between the largest success and the smallest failure, using the refit
   where it lands strictly between them, else the midpoint.

The answer is always the largest size that ran successfully under the limit; a size that
never ran is never returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ...core.limits import SettingError

# A trial runs the step this many times from the user's state: the first creates the optimizer's
# state in a cache laid out for this batch size, and the second runs among it.  On an H200 (a 6-layer
# transformer with AdamW, benchmarks/gpu_autobatch.py) the second step reserved 1.5-1.7 GiB more than
# the first (10%), and a third and fourth no more: one step from a warm state chose sizes that ran out
# of memory when training started.
TRIAL_STEPS = 2


@dataclass(frozen=True)
class Probe:
    """What one run (or estimate) of the step at ``batch_size`` measured."""

    batch_size: int
    peak_bytes: int | None      # None when the run failed before a peak could be read
    ran: bool                   # ran to the end without running out of memory (its peak may be over the
                                # limit); for an estimate, the step ran on fake tensors
    estimated: bool = False     # from fake tensors, not a real run
    seconds: float = 0.0
    error: str | None = None    # the out-of-memory message, for failed runs
    unallocated_bytes: int | None = None  # reserved but unallocated when it ran out (fragmentation)
    allocated_bytes: int | None = None    # torch's allocations alone, where ``peak_bytes`` also counts
                                          # the process's footprint (resident memory on CPU)
    rank_peaks_bytes: tuple[int, ...] | None = None  # with ranks: each one's peak (``peak_bytes`` is the largest)
    footprint_reads: tuple[int, ...] | None = None   # the footprint of each run that read it, kept where the
                                                     # runs disagreed (``peak_bytes`` counts the most)
    leaked: bool = False        # its runs each left more memory held (a leak): the search stopped here


@dataclass(frozen=True)
class MemoryLaw:
    """peak(bs) = fixed_bytes + per_sample_bytes * bs, fitted by least squares."""

    fixed_bytes: float
    per_sample_bytes: float
    points: int
    max_rel_residual: float     # worst |measured - fitted| / measured over the points

    def largest_under(self, limit_bytes: float) -> float:
        """The (fractional) batch size whose fitted peak equals the limit; inf if it never grows."""
        if self.per_sample_bytes <= 0:
            return math.inf
        return (limit_bytes - self.fixed_bytes) / self.per_sample_bytes


def fit_law(points: list[tuple[int, int]]) -> MemoryLaw | None:
    """Least-squares line through (batch size, peak bytes); None with fewer than 2 sizes."""
    sizes = {bs for bs, _ in points}
    if len(sizes) < 2:
        return None
    n = len(points)
    mean_x = sum(bs for bs, _ in points) / n
    mean_y = sum(peak for _, peak in points) / n
    sxx = sum((bs - mean_x) ** 2 for bs, _ in points)
    sxy = sum((bs - mean_x) * (peak - mean_y) for bs, peak in points)
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    residual = max(abs(peak - (intercept + slope * bs)) / max(peak, 1) for bs, peak in points)
    return MemoryLaw(intercept, slope, n, residual)


@dataclass
class Prediction:
    """What the estimates rested on when they chose the first size to verify, and what its run read.

    A real run's peak is predicted as ``fixed_bytes + share * calibration * estimate``: the fake-tensor
    estimate scaled to torch's allocations (``calibration``: fake tensors miss allocator and kernel
    scratch), times what the run takes per byte allocated (``share``: on CPU the process's resident
    memory grows 1.6-2.2x faster than torch's allocations while glibc's heap serves them), plus
    what it holds whatever the size (``fixed_bytes``, read at the smallest size)."""

    batch_size: int | None              # None until a size is verified
    peak_bytes: int | None              # its predicted peak
    calibration: float
    share: float = 1.0
    fixed_bytes: int = 0
    read_at: int = 1                    # the real run ``calibration`` and ``share`` were read at
    measured_bytes: int | None = None   # what the run at ``batch_size`` read (None: it ran out of memory)

    def peak(self, estimate_bytes: int) -> int:
        return round(estimate_bytes * self.calibration * self.share) + self.fixed_bytes


@dataclass
class SearchOutcome:
    batch_size: int | None            # the largest size that ran under the limit; None if none did
    limit_bytes: int
    law: MemoryLaw | None
    probes: list[Probe] = field(default_factory=list)
    reason: str = ""                  # why the search stopped where it did
    prediction: Prediction | None = None  # where estimates chose the first size to verify

    @property
    def calibration(self) -> float | None:
        """torch's allocations in a real run / the fake-tensor estimate, where estimates were used."""
        return self.prediction.calibration if self.prediction is not None else None

    @property
    def real_trials(self) -> int:
        return sum(not p.estimated for p in self.probes)


def fits(probe: Probe, limit_bytes: int) -> bool:
    """A real run that ended and peaked at or under the limit: what an answer must be."""
    return probe.ran and not probe.estimated and probe.peak_bytes is not None and probe.peak_bytes <= limit_bytes


@dataclass(frozen=True)
class SearchSpace:
    min_size: int = 1
    max_size: int = 65536
    multiple_of: int = 1

    def __post_init__(self):
        if self.min_size < 1:
            raise SettingError("min", f"must be at least 1, got {self.min_size}")
        if self.multiple_of < 1:
            raise SettingError("multiple_of", f"must be at least 1, got {self.multiple_of}")
        if self.max_size < self.min_size:
            raise SettingError("max", f"({self.max_size}) is below min ({self.min_size})")
        if self.round_down(self.max_size) < self.min_size:
            raise SettingError("multiple_of", f"{self.multiple_of}: no multiple of it lies between min "
                                              f"{self.min_size} and max {self.max_size}")

    def round_down(self, size: float) -> int:
        """The largest allowed size at or below ``size`` (may fall below min_size)."""
        size = min(size, self.max_size)
        return int(size // self.multiple_of) * self.multiple_of

    @property
    def smallest(self) -> int:
        return -(-self.min_size // self.multiple_of) * self.multiple_of


MAX_REAL_TRIALS = 16
MAX_FIT_POINTS = 8


def search(run: Callable[[int], Probe], limit_bytes: int, space: SearchSpace,
           estimate: Callable[[int], Probe | None] | None = None, *, footprint_scales: bool = False,
           warm: Probe | None = None) -> SearchOutcome:
    """Find the largest allowed batch size whose real run peaks under ``limit_bytes``.

    ``footprint_scales``: a run's peak beyond torch's allocations grows with them (a CPU process's
    resident memory), so estimates are scaled by a real run near the answer before one is verified.
    ``warm``: a real run the caller made already (its warm-up, at the smallest size), taken as the
    search's first trial there rather than run again."""
    __tracebackhide__ = True  # noqa: F841  (an error in a probe is the user's step's: IPython shows their frames)
    out = SearchOutcome(None, limit_bytes, None)
    state = _Bounds()
    real_points: list[tuple[int, int]] = []
    made = {warm.batch_size: warm} if warm is not None else {}

    def trial(size: int) -> Probe:
        __tracebackhide__ = True  # noqa: F841
        probe = made.pop(size, None) or run(size)
        out.probes.append(probe)
        if probe.peak_bytes is not None:
            real_points.append((size, probe.peak_bytes))
        state.record(size, fits(probe, limit_bytes))
        return probe

    # 1. fit points: from estimates, calibrated by one real run, where the probe can estimate;
    #    else from real runs at sizes that grow, ever faster, until the peak does (allocator
    #    rounding can hide small sizes' per-sample cost)
    fit_points = _estimated_points(estimate, space, limit_bytes, trial, out, footprint_scales) if estimate else []
    if not fit_points and state.bad is None:
        fit_points = _measured_points(space, trial, state, dict(real_points))
    if state.good is None and state.bad is not None:
        out.reason = f"the smallest size tried ({state.bad}) does not fit"
        return out

    # 2. predict, 3. verify: climb while runs succeed, then home in between good and bad
    out.law = fit_law(fit_points)
    first_verify = out.prediction is not None
    while out.real_trials < MAX_REAL_TRIALS:
        # the first size verified is the estimates' (the real runs before it only calibrated them)
        law = out.law if first_verify else _local_law(real_points, state) or out.law
        nxt = state.next_size(law, limit_bytes, space)
        if nxt is None:
            break
        probe = trial(nxt)
        if first_verify:
            first_verify = False
            predicted = round(law.fixed_bytes + law.per_sample_bytes * nxt) if law is not None else None
            out.prediction = replace(out.prediction, batch_size=nxt, peak_bytes=predicted,
                                     measured_bytes=probe.peak_bytes if probe.ran else None)
    if len({bs for bs, _ in real_points}) >= 2:
        out.law = fit_law(real_points)  # real runs outrank estimates in the reported law
    out.batch_size = state.good
    out.reason = _reason(state.good, state.bad, space)
    return out


def _measured_points(space: SearchSpace, trial, state: _Bounds, measured: dict[int, int]
                     ) -> list[tuple[int, int]]:
    """Real runs at sizes that grow, ever faster, until the peak grows with them (a size
    already ``measured`` (the first trial, at the smallest size) is not run again)."""
    __tracebackhide__ = True  # noqa: F841
    points: list[tuple[int, int]] = []
    size, growth = space.smallest, 2
    for _ in range(MAX_FIT_POINTS):
        peak = measured[size] if size in measured else trial(size).peak_bytes
        if state.bad is not None:
            break  # a fit size already fails: nothing larger will
        points.append((size, peak))
        law = fit_law(points)
        if law is not None and law.per_sample_bytes > 0:
            break
        if law is not None:
            growth *= 2  # flat so far: the per-sample cost hides below a floor; grow faster
        nxt = space.round_down(size * growth)
        if nxt <= size:
            break
        size = nxt
    return points


ESTIMATE_GROWTH = 8        # estimates are free of memory: sizes 8x apart bracket the limit quickly
MAX_ESTIMATES = 12         # ... but each costs a fake step: stop narrowing after this many
ESTIMATE_PRECISION = 0.01  # narrow the estimated bracket to 1% of its size


def _estimated_points(estimate, space: SearchSpace, limit: int, trial, out: SearchOutcome,
                      footprint_scales: bool) -> list[tuple[int, int]]:
    """Two calibrated estimates that bracket the limit closely: a secant between them predicts
    the answer, whatever the law's shape (curved, or in allocator blocks that hide the per-sample
    cost at small sizes).  The first real run, at the smallest size, calibrates them: fake tensors miss
    the allocator's and kernels' scratch memory, which grows with the batch (a ratio), and what
    the process holds besides torch's allocations (a constant).  Where that footprint grows with
    the allocations (``footprint_scales``), a real run halfway to the predicted answer reads how
    fast, and the estimates are bracketed again with it: predicted from the smallest size alone,
    the first verifying run of a residual CNN read 2.2x the limit."""
    __tracebackhide__ = True  # noqa: F841
    smallest = space.smallest
    first = estimate(smallest)
    if first is None or not first.peak_bytes:
        return []  # the step does not run on fake tensors: fit on real runs
    out.probes.append(first)
    estimated = _Estimates(estimate, out.probes, {smallest: first.peak_bytes})
    real = trial(smallest)
    allocated = real.allocated_bytes if real.allocated_bytes is not None else real.peak_bytes
    if not fits(real, limit) or not allocated:
        return []  # the smallest does not fit, or there is nothing to calibrate against: real runs decide
    out.prediction = Prediction(None, None, allocated / first.peak_bytes, fixed_bytes=real.peak_bytes - allocated,
                                read_at=smallest)
    points = _bracket(estimated, out.prediction, limit, space, (smallest, real.peak_bytes), MAX_ESTIMATES)
    if not points:
        out.prediction = None  # the step stopped running on fake tensors: real runs decide
        return []
    halfway = space.round_down(_predicted_size(points, limit, space) / 2)
    if not footprint_scales or halfway <= smallest:
        return points
    scale = trial(halfway)
    at_halfway = estimated(halfway)
    if not scale.ran or not scale.allocated_bytes or not at_halfway:
        return points  # out of memory halfway (the verifying runs take it from here), or nothing to scale by
    fixed = out.prediction.fixed_bytes
    out.prediction = replace(out.prediction, calibration=scale.allocated_bytes / at_halfway, read_at=halfway,
                             share=max(scale.peak_bytes - fixed, 0) / scale.allocated_bytes)
    start = (halfway, scale.peak_bytes) if fits(scale, limit) else (smallest, real.peak_bytes)
    again = _bracket(estimated, out.prediction, limit, space, start, estimated.made + MAX_ESTIMATES)
    return again or points


class _Estimates:
    """Fake-tensor estimates by size, each made once (a size estimated again is free)."""

    def __init__(self, estimate, probes: list[Probe], made: dict[int, int]):
        self.estimate, self.probes, self.raw = estimate, probes, made

    @property
    def made(self) -> int:
        return len(self.raw)

    def __call__(self, size: int) -> int | None:
        __tracebackhide__ = True  # noqa: F841
        if size not in self.raw:
            probe = self.estimate(size)
            if probe is None or probe.peak_bytes is None:
                return None
            self.probes.append(probe)
            self.raw[size] = probe.peak_bytes
        return self.raw[size]


def _bracket(estimated: _Estimates, prediction: Prediction, limit: int, space: SearchSpace,
             low: tuple[int, int], most: int) -> list[tuple[int, int]]:
    """Predicted peaks that bracket the limit, from ``low`` (a size that fits) up: sizes 8x apart
    find the bracket, then secant steps (bisection where they stall) narrow it until ``most``
    estimates are made.  [fits, over], or [low, the largest allowed size] where that fits too;
    [] where the step stops running on fake tensors."""
    __tracebackhide__ = True  # noqa: F841
    start, high = low, None
    top = space.round_down(space.max_size)
    size = low[0]

    def peak(size: int) -> int | None:
        __tracebackhide__ = True  # noqa: F841
        raw = estimated(size)
        return None if raw is None else prediction.peak(raw)

    while high is None and size < top:  # grow until a predicted peak is over the limit
        size = min(space.round_down(size * ESTIMATE_GROWTH), top)
        predicted = peak(size)
        if predicted is None:
            return []
        if predicted <= limit:
            low = (size, predicted)
        else:
            high = (size, predicted)
    bounds = _Bounds(good=low[0], bad=high[0] if high else None)
    while high is not None and estimated.made < most:
        if high[0] - low[0] <= max(space.multiple_of, ESTIMATE_PRECISION * low[0]):
            break
        size = bounds.next_size(fit_law([low, high]), limit, space)
        if size is None:
            break
        predicted = peak(size)
        if predicted is None:
            break
        bounds.record(size, predicted <= limit)
        if predicted <= limit:
            low = (size, predicted)
        else:
            high = (size, predicted)
    return [low, high] if high is not None else [start, low]


def _predicted_size(points: list[tuple[int, int]], limit: int, space: SearchSpace) -> int:
    """Where the line through ``points`` meets the limit, as an allowed size (0 without points)."""
    law = fit_law(points)
    if law is None:
        return 0
    return max(min(space.round_down(law.largest_under(limit)), space.round_down(space.max_size)), 0)


def _local_law(points: list[tuple[int, int]], state: _Bounds) -> MemoryLaw | None:
    """A line through the real points nearest the boundary: on a curved law, a secant there
    predicts far better than a fit dominated by the small sizes."""
    ceiling = state.bad if state.bad is not None else math.inf
    near = sorted((p for p in points if p[0] <= ceiling), key=lambda p: -p[0])
    if len({bs for bs, _ in near[:2]}) < 2:
        return None
    law = fit_law(near[:2])
    return law if law.per_sample_bytes > 0 else None  # flat (allocator blocks): no information


@dataclass
class _Bounds:
    good: int | None = None    # largest size that ran under the limit
    bad: int | None = None     # smallest size that failed or went over the limit
    slow_steps: int = 0        # predictions in a row that barely narrowed the interval
    same_side: int = 0         # trials in a row that landed on the same side of the boundary
    _last: bool | None = None

    def record(self, size: int, fits: bool) -> None:
        self.same_side = self.same_side + 1 if fits == self._last else 1
        self._last = fits
        if fits:
            self.good = size if self.good is None else max(self.good, size)
        else:
            self.bad = size if self.bad is None else min(self.bad, size)

    def next_size(self, law: MemoryLaw | None, limit: int, space: SearchSpace) -> int | None:
        """The next size to run, strictly between the largest success and the smallest
        failure; None once they are neighbours.  Every run narrows that interval."""
        step = space.multiple_of
        top = space.round_down(space.max_size)
        low = self.good if self.good is not None else space.smallest - step  # below all tried
        high = self.bad if self.bad is not None else top + step               # above all allowed
        if high - low <= step:
            return None
        predicted = space.round_down(law.largest_under(limit)) if law is not None else None
        if predicted is not None and self.bad is not None and predicted <= low:
            # the law puts the limit at the largest success: check its neighbour up.  (A law
            # that predicts at or past a failure has just been proven wrong: bisect instead.)
            predicted = low + step
        inside = predicted is not None and low < predicted < high
        if inside and self.bad is not None and self.good is not None and self.same_side >= 2:
            # a secant that keeps landing on one side converges slowly (a law in allocator
            # blocks, or curved): bisect (the Illinois idea)
            self.same_side = 0
            inside = False
        if inside and self.bad is not None:
            # safeguard the secant: two predictions in a row that cut off less than a quarter,
            # then bisect; a prediction one or two steps from an end is simply checked
            gap = min(predicted - low, high - predicted)
            narrow = 2 * step < gap < (high - low) / 4
            self.slow_steps = self.slow_steps + 1 if narrow else 0
            if self.slow_steps >= 2:
                self.slow_steps = 0
                inside = False
        if inside:
            return predicted
        if self.bad is None:
            return low + step  # the law puts the limit at or below a success: check one step up
        middle = space.round_down((low + high) / 2)
        return middle if low < middle < high else low + step


def _reason(good: int | None, bad: int | None, space: SearchSpace) -> str:
    if good is None:
        return "no size ran under the limit"
    if good >= space.round_down(space.max_size):
        return f"the largest allowed size ({good}) fits"
    if bad is not None:
        return f"{good} fits and {bad} does not"
    return f"{good} fits; the search stopped after {MAX_REAL_TRIALS} real trials"
