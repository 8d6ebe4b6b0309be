"""The result of ``%loadertune`` / ``torchmagic.loadertune``: each setting's throughput, the best,
its speedup over the current settings, and the DataLoader line to copy."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ...core.render.base import Result, png_img, report_html, tabbed
from ...core.render.format import fmt_s
from ...core.render.table import Column, Table


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

    @property
    def median_batches_per_s(self) -> float | None:
        return _median(self.batches_per_s)

    @property
    def median_first_batch_s(self) -> float | None:
        return _median(self.first_batch_s)


@dataclass
class LoaderTuneResult(Result):
    label: str
    device: dict[str, Any]
    current: LoaderSettings
    best: LoaderSettings              # recommended: the current settings unless a change is surely faster
    fastest: LoaderSettings           # the worker count with the highest median batches/s
    rows: list[LoaderRow]
    speedup: float | None             # fastest over current, steady batches/s
    ci: tuple[float, float] | None    # 95% CI of the speedup (paired bootstrap over rounds)
    seconds: float
    cpus: int
    start_method: str
    loader_call: str                  # DataLoader(...) to copy
    step_s: float | None = None       # the training step alone, per batch
    with_step: dict[str, float] = field(default_factory=dict)  # "current"/"best" -> steps/s with the loader
    notes: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    def row(self, settings: LoaderSettings) -> LoaderRow | None:
        return next((r for r in self.rows if r.settings == settings), None)

    @property
    def changes(self) -> dict[str, Any]:
        """The DataLoader keyword arguments to change: those that differ from the current settings,
        less DataLoader's own defaults (prefetch_factor=2, False flags) that need no writing."""
        now = {**DATALOADER_DEFAULTS, **{k: v for k, v in self.current.kwargs().items() if v is not None}}
        return {k: v for k, v in self.best.kwargs().items() if v is not None and now.get(k) != v}

    def headline(self) -> str:
        ci = f" (95% CI {self.ci[0]:.2f}–{self.ci[1]:.2f})" if self.ci else ""
        if self.best == self.current:
            if self.fastest == self.current or self.speedup is None:
                return f"Keep the current settings ({self.current.label()}): they fed batches fastest"
            return (f"Keep the current settings ({self.current.label()}): no setting fed batches faster with 95% "
                    f"confidence (the fastest, {self.fastest.label()}, measured {self.speedup:.2f}×{ci})")
        change = ", ".join(f"{k}={v!r}" for k, v in self.changes.items())
        failing = self.row(self.current)
        if failing is not None and failing.error is not None:
            return f"Set {change}: the current settings ({self.current.label()}) fail (below)"
        return (f"Set {change}: {self.speedup:.2f}× the batches/s{ci} of the current settings "
                f"({self.current.label()})")

    def details(self) -> list[str]:
        lines = [f"copy: {self.loader_call}"]
        lines.append(f"{len(self.rows)} settings, {self.options.get('rounds')} interleaved passes each, on "
                     f"{self.cpus} CPU cores in {fmt_s(self.seconds)}; workers start with {self.start_method!r}; "
                     "batches/s is the loader alone, after its first batch")
        if self.step_s is not None:
            loader_s = 1 / self.row(self.best).median_batches_per_s if self.row(self.best) and \
                self.row(self.best).median_batches_per_s else None
            bound = ("the model (the loader keeps up)" if loader_s is not None and self.step_s >= loader_s
                     else "the loader")
            lines.append(f"the training step alone takes {fmt_s(self.step_s)} a batch; with the current loader "
                         f"{self.with_step.get('current', 0):,.1f} steps/s, with the best "
                         f"{self.with_step.get('best', 0):,.1f} steps/s: the bottleneck is {bound}")
        best = self.best
        if best.persistent_workers and not self.current.persistent_workers:
            fresh, kept = self.row(replace(best, persistent_workers=False)), self.row(best)
            if fresh and kept and fresh.median_batches_per_s and kept.median_batches_per_s:
                lines.append(f"persistent_workers=True keeps the workers between epochs: {_fmt_rate(kept.median_batches_per_s)} "
                             f"batches/s with it, {_fmt_rate(fresh.median_batches_per_s)} without (new epochs' starts included)")
        if best.num_workers > 0 and best.num_workers >= self.cpus:
            lines.append("as many workers as cores: torch's own threads compete with them; on a CPU-only machine "
                         "try torch.set_num_threads(1) in the training process")
        lines += self.notes
        return lines

    def _table(self) -> Table:
        return Table([
            Column("settings", lambda r: r.settings.label() + ("  (current)" if r.settings == self.current else "")
                   + ("  ← best" if r.settings == self.best and self.best != self.current else ""), "left"),
            Column("batches/s", lambda r: _fmt_rate(r.median_batches_per_s)),
            Column("first batch", lambda r: fmt_s(r.median_first_batch_s)),
            Column("result", lambda r: r.error or "", "left", optional=True),
        ], self.rows, noun="settings")

    def interrupted_line(self) -> str:
        return next((n for n in self.notes if n.startswith("interrupted")), "interrupted: what was measured is below")

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(changes=self.changes, headline=self.headline())
        for entry, row in zip(data["rows"], self.rows):
            entry.update(median_batches_per_s=row.median_batches_per_s,
                         median_first_batch_s=row.median_first_batch_s)
        return data

    def to_text(self) -> str:
        return "\n".join([self.headline(), *self.details(), "", self._table().to_text()])

    def plot_png(self) -> bytes | None:
        if not any(r.batches_per_s for r in self.rows):
            return None
        from ...core.render.plot import loader_png

        return loader_png(self)

    def _body_html(self) -> str:
        details = "".join(f'<div class="tm-note">{html.escape(line)}</div>' for line in self.details()[1:])
        return (f'<div class="tm-headline">{html.escape(self.headline())}</div>'
                f"<pre>{html.escape(self.loader_call)}</pre>{details}{self._table().to_html()}")

    def to_html(self) -> str:
        return report_html(self._body_html() + png_img(self.plot_png(), "batches per second for each setting"))

    def widget(self):
        pages: list[tuple[str, str | bytes]] = [("Answer", self._body_html())]
        png = self.plot_png()
        if png:
            pages.append(("Chart", png))
        return tabbed(pages)

    def __repr__(self) -> str:
        return f"<LoaderTuneResult {self.label}: best {self.best.label()}, speedup {self.speedup}>"


def _median(values: list[float]) -> float | None:
    from statistics import median

    return median(values) if values else None


def _fmt_rate(per_s: float | None) -> str:
    """Three significant figures at least, no false precision: 8,078 / 59.2 / 0.41."""
    if not per_s:
        return "–"
    return f"{per_s:,.0f}" if per_s >= 100 else f"{per_s:.3g}"
