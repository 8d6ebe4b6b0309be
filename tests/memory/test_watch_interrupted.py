"""A Ctrl-C wherever one can land while %gpumem --watch starts, restarts or stops leaves no thread without its
owner (issue 51: 1-6 watch threads were left running after 15 tries): at every check point of the watch's
code those commands reach (tests/checkpoints.py), the watch threads alive are the one the magics know, or none."""

from __future__ import annotations

import os
import threading

import pytest

import torchmagic

from ..checkpoints import describe, points_reached, run_interrupted_at
from ..conftest import run

PACKAGE = os.path.dirname(os.path.abspath(torchmagic.__file__)) + os.sep
WATCHING = os.path.join(PACKAGE, "features", "memory") + os.sep


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "torchmagic-memory-watch" and t.is_alive()]


def _known_watch(shell):
    magics = shell.magics_manager.registry["MemoryMagics"]
    watch = magics._watch
    return watch._thread if watch is not None and watch.running else None


def _stopped(shell) -> None:
    run(shell, "%gpumem --stop -q")
    for thread in _watch_threads():
        thread.join(5)


def _interrupted_at(shell, source, point) -> bool:
    fired, (result, captured) = run_interrupted_at(lambda: run(shell, source), point)
    if result.error_in_exec is not None:
        assert isinstance(result.error_in_exec, KeyboardInterrupt), result.error_in_exec
        assert "torchmagic/" not in captured.stdout + captured.stderr
    return fired


@pytest.mark.parametrize("source, before", [
    ("%gpumem --watch 0.05", None),                    # a first start
    ("%gpumem --watch 0.05", "%gpumem --watch 0.05"),  # a restart: the running watch stopped, a new one started
    ("%gpumem --stop -q", "%gpumem --watch 0.05"),     # a stop
])
def test_a_ctrl_c_while_a_watch_starts_or_stops_leaves_no_thread_behind(shell, source, before):
    if before:
        run(shell, before)
    # the watch's own code, where it is made, started and stopped (the argument parsing before it is the
    # interrupt sweep's: tests/test_interrupt_sweep.py)
    points = points_reached(lambda: run(shell, source), lambda code: code.co_filename.startswith(WATCHING))
    _stopped(shell)
    assert points, "no check point of torchmagic's reached"
    hit = 0
    for point in points:
        if before:
            run(shell, before)
        hit += _interrupted_at(shell, source, point)
        alive, known = _watch_threads(), _known_watch(shell)
        assert alive == ([known] if known is not None else []), \
            f"Ctrl-C at {describe(point, PACKAGE)}: {len(alive)} watch threads alive, the magics know {known}"
        _stopped(shell)
        assert _watch_threads() == [], f"Ctrl-C at {describe(point, PACKAGE)}: --stop left a thread"
    assert hit >= len(points) // 2
