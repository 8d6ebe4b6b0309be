"""Bounds on the numbers a magic is given: values no one can mean are refused before anything runs.

A count of 10^20 steps or a time limit of ``inf`` is a typo, not a request, and would otherwise
run until interrupted (or, for worker counts, fork far more processes than the machine can hold).
"""

from __future__ import annotations

import os

MAX_COUNT = 10**6          # steps, rounds, runs, warm-ups, batches
MAX_SECONDS = 24 * 3600.0  # a time limit past a day
WORKERS_PER_CORE = 4       # DataLoader workers beyond this many per usable core only contend


class SettingError(ValueError):
    """A setting refused before anything runs.  The message names it as the Python API does
    (``runs must be at most ...``); a magic names its flag instead (``--runs must be ...``)."""

    def __init__(self, setting: str, problem: str):
        super().__init__(f"{setting} {problem}")
        self.setting, self.problem = setting, problem

    def as_flag(self) -> str:
        """The message with the setting as the magics' flag: min_time → --min-time."""
        return f"--{self.setting.replace('_', '-')} {self.problem}"


def check_count(name: str, value: int | None) -> None:
    """The upper bound of a count (callers check the lower one, with their own words)."""
    if value is not None and value > MAX_COUNT:
        raise SettingError(name, f"must be at most {MAX_COUNT:,}, got {value}")


def check_seconds(name: str, value: float) -> None:
    """A time limit's upper bound, NaN included (callers check that it is positive)."""
    if not value <= MAX_SECONDS:
        raise SettingError(name, f"must be a number of seconds up to a day, got {value}")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def check_workers(workers: tuple[int, ...] | None) -> None:
    if not workers:
        return
    most = WORKERS_PER_CORE * usable_cores()
    if max(workers) > most:
        raise SettingError("workers", f"{max(workers)} is more than {WORKERS_PER_CORE}x the {usable_cores()} usable "
                         f"cores ({most}): each worker is a process with its own copy of the dataset")


def describe_error(exc: BaseException, width: int = 300) -> str:
    """'TypeName: first line of the message', or the type alone for an empty message (MemoryError()).
    A longer line ends at its last sentence that fits (CUDA's out-of-memory message runs 500
    characters on one line), else is cut with an ellipsis."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    line = text.splitlines()[0]
    if len(line) > width:
        sentence = line.rfind(". ", 0, width)
        line = line[:sentence + 1] if sentence > width // 3 else line[:width - 1] + "…"
    return f"{type(exc).__name__}: {line}"
