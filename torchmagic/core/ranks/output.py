"""The ranks' output, followed as it is written and shown live, each line with its rank."""

from __future__ import annotations

import sys
from collections.abc import Callable

from ..devices.profiler import is_profiler_banner


class RankOutput:
    """The ranks' output files, read as they grow: each complete line handed on with its rank.
    The files are the ranks' current ones (``logs`` grows when ranks are restarted)."""

    def __init__(self, logs: list[tuple[int, str, bool]], on_output: Callable[[int, str, bool], None]):
        self.logs = logs  # (rank, path, is stderr): the RankProcesses' own list
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, str] = {}
        self.on_output = on_output
        self.last_error_line: dict[int, str] = {}

    def poll(self, final: bool = False) -> None:
        for rank, path, is_err in list(self.logs):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(self.offsets.get(path, 0))
                    text = f.read()
                    self.offsets[path] = f.tell()
            except FileNotFoundError:
                continue
            lines = (self.partial.get(path, "") + text).split("\n")
            self.partial[path] = "" if final else lines.pop()
            for line in lines if not final else [x for x in lines if x]:
                if is_profiler_banner(line):
                    continue
                self.on_output(rank, line, is_err)
                if is_err and line.strip():
                    self.last_error_line[rank] = line.strip()


def show_rank_line(rank: int, line: str, is_err: bool) -> None:
    """The default: each line printed as it comes, ``[rank R]`` first, to stdout or stderr as written."""
    print(f"[rank {rank}] {line}", file=sys.stderr if is_err else sys.stdout)
