"""Bounds on the numbers a magic is given: values no one can mean are refused before anything runs.

A count of 10^20 steps or a time limit of ``inf`` is a typo, not a request, and would otherwise
run until interrupted (or, for worker counts, fork far more processes than the machine can hold).
"""

from __future__ import annotations

import os
import re

MAX_COUNT = 10**6          # steps, rounds, runs, warm-ups, batches
MAX_SECONDS = 24 * 3600.0  # a time limit past a day
WORKERS_PER_CORE = 4       # DataLoader workers beyond this many per usable core only contend
MIN_BUDGET_BYTES = 2**20   # below a MiB no step of a model runs: such a memory budget is a slip (1B for 1GB)

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
          "g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


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


def parse_budget_text(setting: str, text: str) -> float:
    """A memory budget as written on a magic's line: '8GiB', '512MB', '2e9' (bytes) or '0.9' (a fraction of
    memory, up to 1).  A size with a unit is a size, however small: '1B' is one byte (refused), never the
    fraction 1.  Bad text raises a SettingError naming ``setting``."""
    match = _SIZE.match(text)
    if not match:
        raise SettingError(setting, f"takes bytes such as 8GiB or 512MiB, or a fraction such as 0.9; got {text!r}")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if number <= 0:
        raise SettingError(setting, f"must be positive, got {text!r}")
    if not unit and number <= 1:
        return number  # a fraction of the memory
    size = number * _UNITS[unit]
    if size < MIN_BUDGET_BYTES:
        raise SettingError(setting, f"{text} is {size:,.0f} byte(s): too small to run any step (a size is at least "
                                    "1MiB; a fraction of memory is written without a unit, such as 0.5)")
    return size


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
