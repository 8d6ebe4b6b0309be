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


class heap_set_aside(HeldScope):
    """Collect once, then set aside every object the process holds (``gc.freeze()``), so the full collections
    made inside (autobatch's, after each failed trial and at the end) scan only the objects made since: in a
    notebook of millions of objects (torch, IPython, the user's data) each otherwise costs 0.3-1 s.  They go
    back to the oldest generation on the way out, where a full collection leaves them.  A process that froze
    objects of its own (``gc.get_freeze_count()``) is left as it is: unfreezing would take theirs too."""

    __slots__ = ("_froze",)

    def acquire(self) -> None:
        gc.collect()
        self._froze = gc.get_freeze_count() == 0
        if self._froze:
            gc.freeze()

    def release(self) -> None:
        if self._froze:
            gc.unfreeze()
