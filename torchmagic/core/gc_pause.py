"""The cycle collector paused for a report's many small objects, and always turned back on."""

from __future__ import annotations

import gc

from .interrupts import HeldScope


class gc_paused(HeldScope):
    """Pause the cycle collector, as timeit does.  A report makes thousands of small objects and
    no cycles; a full collection they trigger in a big process (torch, IPython) costs ~200 ms,
    20 times the report itself.  A Ctrl-C never leaves the collector off (HeldScope)."""

    __slots__ = ("_was_enabled",)

    def acquire(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()

    def release(self) -> None:
        if self._was_enabled:
            gc.enable()
