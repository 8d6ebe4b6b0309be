"""What the --ranks tests check after a run: the processes, threads, fds and SIGINT handler the
notebook had before it; and other processes that keep the cores busy."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time


def child_pids() -> set[int]:
    """This process's descendants (multiprocessing's resource tracker, started once, aside).

    A child that ended but was not yet reaped (a zombie: torch terminates a slow DataLoader worker
    without waiting for it) has no command line to read; it still counts, so a run that leaves one fails."""
    import psutil

    pids = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" in " ".join(p.cmdline()):
                continue
        except psutil.ZombieProcess:
            pass
        except psutil.NoSuchProcess:  # gone between the listing and the reading
            continue
        pids.add(p.pid)
    return pids


def record_rank_starts(monkeypatch) -> list:
    """Every start of ranks (RankProcesses.acquire: their folder, then their processes) is recorded and
    refused instead: a refusal test asserts the list stays empty, which no machine's load can change."""
    from torchmagic.core.ranks import processes

    started = []

    def refused(self):
        started.append(self.ranks)
        raise RuntimeError("test: ranks were started")

    monkeypatch.setattr(processes.RankProcesses, "acquire", refused)
    return started


def process_state() -> tuple:
    import psutil

    _draw_text_once()

    return child_pids(), threading.active_count(), psutil.Process().num_fds(), signal.getsignal(signal.SIGINT)


def assert_left_as_it_was(before: tuple) -> None:
    """Nothing started, opened or replaced by the run is left: fewer is fine (a child that ended)."""
    children, threads, fds, handler = before
    now_children, now_threads, now_fds, now_handler = process_state()
    assert now_children <= children, (now_children, children)
    assert now_threads == threads, threading.enumerate()
    assert now_fds <= fds, (now_fds, fds)
    assert now_handler is handler


def _draw_text_once() -> None:
    """matplotlib keeps its font files open once it has drawn text (its font cache): draw some
    before counting fds, so a report's first plot is not counted as a leak."""
    from torchmagic.core.render.plot import figure_png, new_figure

    fig = new_figure(1, 1)
    ax = fig.add_subplot()
    ax.set_title("fonts")
    figure_png(fig)


@contextlib.contextmanager
def busy_cores():
    """A busy loop in its own process on every core this process may use; killed and reaped on the way out."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        time.sleep(0.2)  # started: an interpreter takes ~50 ms to begin its loop
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
