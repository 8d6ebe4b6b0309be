"""The result of ``torchmagic.analyze``: per-rank time per step, the straggler and findings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ....core.render.base import Result
from ..result import Finding, ProfileResult


@dataclass
class RankSummary:
    """One rank, in seconds per profiled step (averages over its steps).

    ``comm_s`` is the time a collective was executing; ``exposed_comm_s`` the part of it with
    no compute (or data loading) beside it, which the step pays in full.  Of the collectives
    found on every rank, ``wait_s`` is the time spent waiting for the others to arrive and
    ``transfer_s`` the rest (with collectives cut short by the end of profiling left out, the
    two may add up to less than ``comm_s``)."""

    rank: int | None
    path: str
    device: str                     # "gpu": compute and communication read from kernels; "cpu"
    steps: int                      # ProfilerStep markers (0: the whole trace as one window)
    step_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    wait_s: float
    transfer_s: float
    exposed_transfer_s: float       # the transfers' part with no compute beside it
    dataloader_s: float
    idle_s: float                   # neither compute, data loading nor communication
    phases_s: dict[str, float] = field(default_factory=dict)
    collectives: dict[str, dict] = field(default_factory=dict)  # op -> calls, seconds_per_step, bytes
    step_waits_s: dict[int, float] = field(default_factory=dict)  # step number -> seconds waiting
    events: int = 0


@dataclass(frozen=True)
class StepLane:
    """One rank's drawn step: (start, duration) seconds from the step's start, per kind of time."""

    rank: int | None
    step: int | None
    step_s: float
    spans: dict[str, list[tuple[float, float]]]


@dataclass(repr=False)
class TraceAnalysis(Result):
    """What the traces of one job say, rank by rank and across ranks."""

    source: str
    ranks: list[RankSummary]
    straggler: int | None = None
    straggler_phase: str | None = None
    straggler_reason: str | None = None
    findings: list[Finding] = field(default_factory=list)  # across ranks; with one rank, its own too
    profile: ProfileResult | None = None  # one rank: its operators, categories and findings, as %%torchprofile
    lanes: list[StepLane] = field(default_factory=list)
    lane_step: int | None = None
    world_size: int | None = None
    backend: str | None = None
    notes: list[str] = field(default_factory=list)
    events: int = 0
    bytes_read: int = 0
    analysis_s: float = 0.0

    def _view(self):
        from . import view  # imported when first shown (it imports this module for type checking only)

        return view

    def rank(self, number: int) -> RankSummary:
        return next(r for r in self.ranks if r.rank == number)

    def finding(self, rule: str) -> Finding | None:
        return next((f for f in self.findings if f.rule == rule), None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["profile"] = self.profile.to_dict() if self.profile is not None else None
        return data
