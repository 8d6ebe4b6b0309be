"""A Ctrl-C wherever one can land in torchmagic's own code while each magic runs, in a real IPython shell.

For each magic of the fault matrix (tests/test_faults.py), the check points of torchmagic's code it
reaches are recorded (the places Python runs a signal handler: tests/checkpoints.py); then the
magic runs again once per chosen point, with SIGINT delivered there (the handler in place called as
Python calls it).  Chosen: a seeded sample of the points in the functions that give something back
(``@uninterruptible``, and HeldScope's acquire/release) and of the others; ``TORCHMAGIC_SWEEP=all``
takes them all (the exhaustive sweep, many minutes per magic).  After each: the user's traceback
only, torch's settings, the profiler, gc, fd 2, threads, child processes, file descriptors, the
SIGINT handler, the model and optimizer as before (weights too, for the magics that restore them),
no new names but the result, and the kernel runs cells; at the end, the magic runs to completion.
"""

from __future__ import annotations

import gc
import os
import random
import signal

import psutil
import pytest
import torch

import torchmagic
from torchmagic.core import interrupts
from torchmagic.core.ipython import CellMagicHelp, user_frames_only

from .checkpoints import describe, points_reached, run_interrupted_at
from .conftest import LONG
from .test_faults import MAGICS, SETUP, assert_unchanged, run, state

pytestmark = pytest.mark.slow

PACKAGE = os.path.dirname(os.path.abspath(torchmagic.__file__)) + os.sep
# points per magic: in CI 15 in the functions that give something back and 5 elsewhere (about 75 s for the
# five magics), 30 and 10 in the long lane; interrupts.py is tested line by line in tests/core/test_interrupts.py
# and left out here
SAMPLED_GIVING_BACK, SAMPLED = (30, 10) if LONG else (15, 5)
RESTORING = ("amp_compare", "autobatch", "loadertune")
# the fault matrix's magics on a shorter cell: hundreds of runs each
SWEPT = {magic: source.replace("range(200)", "range(5)") for magic, source in MAGICS.items()}


@pytest.fixture
def notebook(shell):
    shell.run_cell(SETUP)
    return shell


def _points_run(shell, source) -> list[tuple]:
    """The check points (tests/checkpoints.py) of torchmagic's code the magic reaches."""
    own = os.path.join(PACKAGE, "core", "interrupts.py")
    points = points_reached(lambda: run(shell, source),
                            lambda code: code.co_filename.startswith(PACKAGE) and code.co_filename != own)
    return [p for p in points if not (p[0] == "entry" and p[1] in _CALLED_BY_IPYTHON)]


# The start of a frame IPython calls: the magic's (user_frames_only's wrapper) and the AST
# transformer's that every cell passes through (CellMagicHelp.visit).  No code can catch what lands
# before the frame's own `try`, so a Ctrl-C there shows that one frame, as one landing in IPython's
# own code would show IPython's.  These are the only such windows; the sweep leaves them out.
_CALLED_BY_IPYTHON = (user_frames_only(lambda self: None).__code__, CellMagicHelp.visit.__code__)


def _gives_back(code) -> bool:
    """Marked @uninterruptible, or the acquire/release of a HeldScope (run from its marked methods)."""
    return code in interrupts._critical or code.co_name in ("acquire", "release")


def _chosen(points: list[tuple], seed: str) -> list[tuple]:
    critical = [p for p in points if _gives_back(p[1])]
    others = [p for p in points if not _gives_back(p[1])]
    if os.environ.get("TORCHMAGIC_SWEEP") == "all":
        return critical + others
    rng = random.Random(seed)
    return (rng.sample(critical, min(SAMPLED_GIVING_BACK, len(critical)))
            + rng.sample(others, min(SAMPLED, len(others))))


def _run_interrupted_at(shell, source, point):
    fired, (result, captured) = run_interrupted_at(lambda: run(shell, source), point)
    return fired, result, captured


def _fds() -> int:
    return psutil.Process().num_fds()


@pytest.fixture
def frozen_heap():
    """The test session's heap set aside from the collector (gc.freeze): the magics' full collections
    and the checks' then scan what the runs made, not everything pytest holds (autobatch, finding objects
    frozen already, leaves them so: no run may add to the count, which falls as frozen objects are freed)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("magic", SWEPT)
def test_a_ctrl_c_at_torchmagics_lines_leaves_nothing_behind(notebook, magic, frozen_heap):
    shell, source = notebook, SWEPT[magic]
    run(shell, source)  # first-use imports and caches
    chosen = _chosen(_points_run(shell, source), magic)
    fd2, frozen = os.fstat(2).st_ino, gc.get_freeze_count()
    names = set(shell.user_ns) | {"faulted", "_", "__", "___"}
    fds = _fds()
    hit = interrupted = 0
    for done, point in enumerate(chosen):
        if done and done % 100 == 0:
            print(f"{magic}: {done} of {len(chosen)} check points", flush=True)  # for the exhaustive sweep
        shell.run_cell(SETUP)  # a fresh model each time: 200 steps a run would train it to NaN
        before = state(shell)
        fired, result, captured = _run_interrupted_at(shell, source, point)
        where = f"{magic}: Ctrl-C at {describe(point, PACKAGE)}"
        hit += fired
        if isinstance(result.error_in_exec, KeyboardInterrupt):
            interrupted += 1
            shown = captured.stdout + captured.stderr
            assert "torchmagic/" not in shown, f"{where}: our frames shown:\n{shown[-2000:]}"
        else:
            assert result.error_in_exec is None, f"{where}: {result.error_in_exec!r}"
        if magic not in RESTORING:  # the cell ran partly, as it would without the magic (its loss
            before["weights"] = []  # is unbounded: 600 steps take the weights to inf and NaN)
        assert_unchanged(shell, before, where)
        assert gc.isenabled() and gc.get_freeze_count() <= frozen and os.fstat(2).st_ino == fd2, where
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not interrupts.is_guarded(), where
        assert torch.is_grad_enabled(), where
        history = {k for k in shell.user_ns if k.startswith("_i") or k.lstrip("_").isdigit()}  # IPython's In/Out
        assert set(shell.user_ns) <= names | history, \
            f"{where}: new names {set(shell.user_ns) - names}"
    gc.collect()
    assert _fds() <= fds + 2, f"{magic}: file descriptors grew from {fds} to {_fds()}"
    final, captured = run(shell, source)
    assert final.success, f"{magic}: the magic no longer runs: {final.error_in_exec!r}"
    print(f"{magic}: {len(chosen)} check points chosen, {hit} reached, {interrupted} interrupted")
    assert hit >= len(chosen) // 2
