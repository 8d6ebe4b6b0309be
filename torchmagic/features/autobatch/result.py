"""The result of ``torchmagic.autobatch``: the verified batch size, the memory law, the trials."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...core.devices import DeviceInfo
from ...core.render.base import Result
from .leak import Leak
from .options import AutobatchOptions
from .search import Prediction


@dataclass(frozen=True)
class Trial:
    batch_size: int
    peak_bytes: int | None      # peak above the start of the run, what the limit is for; None when it ran out of memory
    ran: bool                   # a real run that ended without running out of memory, over the limit or not
    ok: bool                    # it ran and peaked at or under the limit: a size that fits
    seconds: float
    estimated: bool = False     # a fake-tensor estimate, not a run
    error: str | None = None
    samples_per_s: float | None = None
    allocated_bytes: int | None = None  # torch's allocations alone; ``peak_bytes`` is the larger of these
                                        # and the process's footprint (resident memory on CPU, reserved on CUDA)
    rank_peaks_bytes: tuple[int, ...] | None = None  # with ranks: each rank's peak, by rank (``peak_bytes``:
                                                     # the largest, since a size fits only if it fits on every rank)
    footprint_reads: tuple[int, ...] | None = None  # the footprint read in runs of their own, kept where they
                                                    # disagreed; ``peak_bytes`` counts the most
    leaked: bool = False        # its runs each left more memory held (a leak): the search stopped here


KNEE_TOLERANCE = 0.05  # the knee: the smallest size within 5% of the best samples/s


@dataclass(frozen=True)
class ThroughputPoint:
    batch_size: int
    samples_per_s: float
    seconds_per_step: float


@dataclass
class AutobatchResult(Result):
    """Bytes are what a step adds on top of the memory in use when the search started.  With
    ``ranks`` > 1 (``%%autobatch --ranks N``) sizes and bytes are per rank: every rank ran each
    trial, and the budget is the least any rank has."""

    label: str
    device: DeviceInfo
    batch_size: int | None            # the largest size that ran under the limit (never untested)
    budget_bytes: int
    limit_bytes: int                  # budget less the margin: what a trial's peak must stay under
    budget_source: str
    fixed_bytes: float | None         # the fitted law: peak(bs) = fixed + per_sample * bs
    per_sample_bytes: float | None
    trials: list[Trial] = field(default_factory=list)
    accumulation_steps: int | None = None
    micro_batch: int | None = None    # with accumulation: the even split of the target batch
    reason: str = ""
    options: AutobatchOptions = field(default_factory=AutobatchOptions)
    seconds: float = 0.0
    memory_before_bytes: int | None = None
    memory_after_bytes: int | None = None
    throughput: list[ThroughputPoint] = field(default_factory=list)
    prediction: Prediction | None = None  # what the estimates predicted, on what, and what its run read
    notes: list[str] = field(default_factory=list)
    ranks: int = 1                    # processes each running the step at ``batch_size`` (data parallel)
    restarts: int = 0                 # with ranks: times every rank was started again after one ran out
    leak: Leak | None = None          # the step kept more memory after every call at one size: the search
                                      # stopped there, and ``batch_size`` is the largest verified until then

    def _view(self):
        from . import view  # imported when first shown (it imports this module for type checking only)

        return view

    @property
    def calibration(self) -> float | None:
        """torch's allocations in a real run / the fake-tensor estimate, where estimates were used."""
        return self.prediction.calibration if self.prediction is not None else None

    @property
    def global_batch_size(self) -> int | None:
        """Samples per step over all ranks: what the learning rate and the data see."""
        return None if self.batch_size is None else self.batch_size * self.ranks

    @property
    def knee_batch_size(self) -> int | None:
        """The smallest measured size within 5% of the best samples/s: past it, a bigger batch
        buys memory pressure, not speed."""
        if not self.throughput:
            return None
        best = max(p.samples_per_s for p in self.throughput)
        return min(p.batch_size for p in self.throughput if p.samples_per_s >= (1 - KNEE_TOLERANCE) * best)

    @property
    def answer_trial(self) -> Trial | None:
        return next((t for t in reversed(self.trials)
                     if t.batch_size == self.batch_size and t.ok), None)

    # -- views: rendered by view.py ---------------------------------------------------
    def details(self) -> list[str]:
        return self._view().details(self)

    def plot_png(self) -> bytes | None:
        return self._view().plot_png(self)

    def interrupted_line(self) -> str:
        return self.reason or "interrupted: the trials that ran are below"

    def to_dict(self) -> dict:
        data = {**asdict(self), "device": self.device.to_dict()}
        data["answer_trial"] = asdict(self.answer_trial) if self.answer_trial else None
        data["knee_batch_size"] = self.knee_batch_size
        data["global_batch_size"] = self.global_batch_size
        return data

    def __repr__(self) -> str:
        return f"<AutobatchResult {self.label}: batch_size={self.batch_size}, {len(self.trials)} trials>"
