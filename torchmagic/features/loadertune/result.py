"""The result of ``%loadertune`` / ``torchmagic.loadertune``: each setting's throughput, the best,
its speedup over the current settings, and the DataLoader line to copy."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.devices import DeviceInfo
from ...core.expectations import Expectation, Measured
from ...core.render.base import Result
from .options import TunedWith


DATALOADER_DEFAULTS = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": 2}


@dataclass(frozen=True)
class LoaderSettings:
    num_workers: int
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None   # None without workers (DataLoader refuses it then)

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            out.update(persistent_workers=self.persistent_workers, prefetch_factor=self.prefetch_factor)
        return out

    def label(self) -> str:
        if self.num_workers == 0:
            parts = ["num_workers=0"]
        else:
            parts = [f"num_workers={self.num_workers}", f"prefetch_factor={self.prefetch_factor}"]
            if self.persistent_workers:
                parts.append("persistent_workers")
        if self.pin_memory:
            parts.append("pin_memory")
        return ", ".join(parts)


@dataclass
class LoaderRow:
    settings: LoaderSettings
    batches_per_s: list[float] = field(default_factory=list)   # steady state, one per pass (round)
    first_batch_s: list[float] = field(default_factory=list)   # from iter() to the first batch, per pass
    error: str | None = None
    speedup: float | None = None                # over the current settings, in the rounds that ran both
    ci: tuple[float, float] | None = None       # its 95% CI (order statistics of per-round ratios)

    def measured(self, expected: Expectation | None = None) -> Measured | None:
        """Its speedup over the current settings with its 95% CI, as a finding's verify reads it."""
        return None if self.speedup is None or self.ci is None else Measured(self.speedup, self.ci, expected)

    @property
    def median_batches_per_s(self) -> float | None:
        return _median(self.batches_per_s)

    @property
    def median_first_batch_s(self) -> float | None:
        return _median(self.first_batch_s)


@dataclass
class LoaderTuneResult(Result):
    label: str
    device: DeviceInfo
    current: LoaderSettings
    best: LoaderSettings              # recommended: the current settings unless a change is surely faster
    fastest: LoaderSettings           # the highest speedup over the current settings in the rounds that ran
                                      # both (the current settings when none measured faster)
    rows: list[LoaderRow]
    speedup: float | None             # best over current, steady batches/s; when best is current, the
                                      # fastest over current (None when the current settings are the fastest)
    ci: tuple[float, float] | None    # 95% CI of the speedup (order statistics of per-round ratios)
    seconds: float
    cpus: int
    start_method: str
    loader_call: str                  # DataLoader(...) to copy
    step_s: float | None = None       # the training step alone, per batch
    with_step: dict[str, float] = field(default_factory=dict)  # "current"/"best" -> steps/s with the loader
    notes: list[str] = field(default_factory=list)
    options: TunedWith = field(default_factory=TunedWith)
    expectation_check: Measured | None = None  # --expect: the change's speedup against the prediction
    stopped: str | None = None        # why the sweep ended early (a Ctrl-C, the user's dataset raising)

    def _view(self):
        from . import view  # imported when first shown (it imports this module for type checking only)

        return view

    def row(self, settings: LoaderSettings) -> LoaderRow | None:
        return next((r for r in self.rows if r.settings == settings), None)

    @property
    def changes(self) -> dict[str, Any]:
        """The DataLoader keyword arguments to change: those that differ from the current settings,
        less DataLoader's own defaults (prefetch_factor=2, False flags) that need no writing."""
        now = {**DATALOADER_DEFAULTS, **{k: v for k, v in self.current.kwargs().items() if v is not None}}
        return {k: v for k, v in self.best.kwargs().items() if v is not None and now.get(k) != v}

    @property
    def change(self) -> LoaderRow | None:
        """The change a finding's prediction is judged by: the recommended settings, or when those are the
        current ones, the other setting that measured fastest against them (slower, maybe)."""
        if self.best != self.current:
            return self.row(self.best)
        others = [row for row in self.rows if row.settings != self.current and row.speedup is not None]
        return max(others, key=lambda row: row.speedup, default=None)

    # -- views: rendered by view.py ---------------------------------------------------
    def details(self) -> list[str]:
        return self._view().details(self)

    def plot_png(self) -> bytes | None:
        return self._view().plot_png(self)

    def interrupted_line(self) -> str:
        return self.stopped or "interrupted: what was measured is below"

    def to_dict(self) -> dict:
        data = {**asdict(self), "device": self.device.to_dict()}
        data.update(changes=self.changes, headline=self.headline())
        for entry, row in zip(data["rows"], self.rows):
            entry.update(median_batches_per_s=row.median_batches_per_s,
                         median_first_batch_s=row.median_first_batch_s)
        return data

    def __repr__(self) -> str:
        return f"<LoaderTuneResult {self.label}: best {self.best.label()}, speedup {self.speedup}>"


def _median(values: list[float]) -> float | None:
    from statistics import median

    return median(values) if values else None

