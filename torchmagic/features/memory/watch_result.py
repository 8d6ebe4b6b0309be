"""Samples from a memory watch; watch_view.py draws them (text, and the small inline chart its live
view redraws each sample)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...core.render.base import Result


@dataclass(frozen=True)
class DeviceSample:
    label: str
    allocated_bytes: int | None
    reserved_bytes: int | None
    used_bytes: int | None      # NVML, all processes
    utilization_pct: float | None


@dataclass(frozen=True)
class WatchSample:
    t: float                    # seconds since the watch started
    rss_bytes: int | None       # this process's resident memory
    available_bytes: int
    devices: tuple[DeviceSample, ...] = ()


@dataclass(repr=False)  # Result's short repr, not every sample
class WatchResult(Result):

    samples: list[WatchSample]
    interval_s: float
    seconds: float
    cpu_seconds: float          # the sampling thread's own CPU time
    notes: list[str] = field(default_factory=list)
    running: bool = False

    def _view(self):
        from . import watch_view  # imported when first shown (it imports this module for type checking only)

        return watch_view

    def to_dict(self) -> dict:
        return asdict(self)

    # -- views: rendered by watch_view.py --------------------------------------------
    def lines(self) -> list[str]:
        return self._view().lines(self)

    def chart_svg(self, width: int = 640, height: int = 150) -> str:
        """Memory and utilisation over time as inline SVG (see watch_view.chart_svg)."""
        return self._view().chart_svg(self, width, height)
