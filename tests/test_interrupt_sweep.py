"""A Ctrl-C at lines of torchmagic's own code while each magic runs, through a real IPython shell.

For each magic of the fault matrix (tests/test_faults.py), the lines of torchmagic it executes are
recorded; then the magic runs again once per chosen line, with SIGINT delivered there (the handler
in place called as Python calls it).  Chosen: every line of the functions that give something back
(``@uninterruptible``, and HeldScope's acquire/release), and a seeded sample of the others; ``TORCHMAGIC_SWEEP=all`` takes them all
(the exhaustive sweep, minutes per magic).  After each: the user's traceback only, torch's settings,
the profiler, gc, fd 2, threads, child processes, file descriptors, the SIGINT handler, the model
and optimizer as before (weights too, for the magics that restore them), no new names but the
result, and the kernel runs cells; at the end, the magic runs to completion.
"""

from __future__ import annotations

import dis
import gc
import os
import random
import signal
import sys

import psutil
import pytest
import torch

import torchmagic
from torchmagic.core import interrupts
from torchmagic.core.ipython import user_frames_only

from .test_faults import MAGICS, SETUP, assert_unchanged, run, state
from .core.test_interrupts import interrupt_at

pytestmark = pytest.mark.slow

PACKAGE = os.path.dirname(os.path.abspath(torchmagic.__file__)) + os.sep
# lines per magic in CI (about two minutes for the five); interrupts.py is tested line by line in
# tests/core/test_interrupts.py and left out here
SAMPLED_GIVING_BACK, SAMPLED = 30, 10
RESTORING = ("amp_compare", "autobatch", "loadertune")
# the fault matrix's magics on a shorter cell: hundreds of runs each
SWEPT = {magic: source.replace("range(200)", "range(5)") for magic, source in MAGICS.items()}


@pytest.fixture
def notebook(shell):
    shell.run_cell(SETUP)
    return shell


def _lines_run(shell, source) -> list[tuple]:
    seen: dict[tuple, None] = {}

    def local(frame, event, arg):
        if event == "line":
            seen.setdefault((frame.f_code, frame.f_lineno))
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(PACKAGE) else None

    sys.settrace(tracer)
    try:
        run(shell, source)
    finally:
        sys.settrace(None)
    own = os.path.join(PACKAGE, "core", "interrupts.py")
    return [key for key in seen if key[0].co_filename != own and key not in _ENTRY and not _only_nops(*key)]


def _only_nops(code, line: int) -> bool:
    """A line made of NOPs (a ``try:``).  Python runs a signal handler only where it checks for
    signals (a call, a backward jump, a function's start), never at a NOP; and a trace function
    raising at a ``try:`` that opens a ``with`` block escapes the block (CPython 3.11 leaves that
    NOP out of the block's exception table), which no real Ctrl-C can do."""
    ops = [i.opname for i in dis.get_instructions(code) if i.positions and i.positions.lineno == line]
    return bool(ops) and all(op == "NOP" for op in ops)


# The first line of the magic's outermost frame (user_frames_only's wrapper, which IPython calls):
# no code can catch what lands before its own `try`, so a Ctrl-C there shows that one frame.
# Python checks for signals at a function's entry, so this one instruction is the magics' only
# window: the sweep leaves it out, and says so.
_WRAPPER = user_frames_only(lambda self: None).__code__
_ENTRY = {(_WRAPPER, [line for _, line in dis.findlinestarts(_WRAPPER)][1])}  # [0] is the def's RESUME


def _gives_back(code) -> bool:
    """Marked @uninterruptible, or the acquire/release of a HeldScope (run from its marked methods)."""
    return code in interrupts._critical or code.co_name in ("acquire", "release")


def _chosen(lines: list[tuple], seed: str) -> list[tuple]:
    critical = [key for key in lines if _gives_back(key[0])]
    others = [key for key in lines if not _gives_back(key[0])]
    if os.environ.get("TORCHMAGIC_SWEEP") == "all":
        return critical + others
    rng = random.Random(seed)
    return (rng.sample(critical, min(SAMPLED_GIVING_BACK, len(critical)))
            + rng.sample(others, min(SAMPLED, len(others))))


def _run_interrupted_at(shell, source, code, line):
    tracer, fired = interrupt_at(code, line)
    sys.settrace(tracer)
    try:
        result, captured = run(shell, source)
    finally:
        sys.settrace(None)
    return bool(fired), result, captured


def _fds() -> int:
    return psutil.Process().num_fds()


@pytest.mark.parametrize("magic", SWEPT)
def test_a_ctrl_c_at_torchmagics_lines_leaves_nothing_behind(notebook, magic):
    shell, source = notebook, SWEPT[magic]
    run(shell, source)  # first-use imports and caches
    chosen = _chosen(_lines_run(shell, source), magic)
    fd2 = os.fstat(2).st_ino
    names = set(shell.user_ns) | {"faulted", "_", "__", "___"}
    fds = _fds()
    hit = interrupted = 0
    for code, line in chosen:
        shell.run_cell(SETUP)  # a fresh model each time: 200 steps a run would train it to NaN
        before = state(shell)
        fired, result, captured = _run_interrupted_at(shell, source, code, line)
        where = f"{magic}: Ctrl-C at {os.path.relpath(code.co_filename, PACKAGE)}:{line} ({code.co_name})"
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
        assert gc.isenabled() and os.fstat(2).st_ino == fd2, where
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not interrupts.is_guarded(), where
        assert torch.is_grad_enabled(), where
        history = {k for k in shell.user_ns if k.startswith("_i") or k.lstrip("_").isdigit()}  # IPython's In/Out
        assert set(shell.user_ns) <= names | history, \
            f"{where}: new names {set(shell.user_ns) - names}"
    gc.collect()
    assert _fds() <= fds + 2, f"{magic}: file descriptors grew from {fds} to {_fds()}"
    final, captured = run(shell, source)
    assert final.success, f"{magic}: the magic no longer runs: {final.error_in_exec!r}"
    print(f"{magic}: {len(chosen)} lines chosen, {hit} reached, {interrupted} interrupted")
    assert hit >= len(chosen) // 2
