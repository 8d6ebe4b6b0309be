"""What a result's live controls run, kept beside the results a magic showed, not on them.

A result is plain data: it pickles, copies, saves and loads.  The verify buttons of a profile need a
callback into the kernel that made it (it runs a command on top of the profiled cell), which is none of
those.  So the magic hands the callback here, against the result, for as long as that result lives;
its view asks for it when it draws its controls.  A result loaded from a file, or made by the Python
API, has none: its report shows without buttons.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

_RUNNERS: dict[int, Callable[[Any, str], Any]] = {}  # by the result's id, dropped when the result is collected


def set_runner(result, runner: Callable[[Any, str], Any]) -> None:
    """``runner(result, command)`` runs a verify command of ``result``'s findings, for as long as the
    result lives.  It must not refer to the result (it is handed it), or the result would never go."""
    key = id(result)
    if key not in _RUNNERS:
        weakref.finalize(result, _RUNNERS.pop, key, None)
    _RUNNERS[key] = runner


def runner(result) -> Callable[[Any, str], Any] | None:
    return _RUNNERS.get(id(result))
