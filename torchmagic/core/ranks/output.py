"""The ranks' output, followed as it is written and shown live, each line with its rank."""

from __future__ import annotations

import codecs
import sys
from collections.abc import Callable

from ..devices.profiler import is_profiler_banner


MAX_LINE = 10_000        # characters of a line shown; the rest of a longer line is left out, said once
READ_CHUNK = 1 << 20     # bytes read from a rank's file per poll: a rank that writes fast cannot fill memory


class RankOutput:
    """The ranks' output files, read as they grow: each complete line handed on with its rank.
    The files are the ranks' current ones (``logs`` grows when ranks are restarted).  A line is
    kept up to MAX_LINE characters however long the rank writes it."""

    def __init__(self, logs: list[tuple[int, str, bool]], on_output: Callable[[int, str, bool], None]):
        self.logs = logs  # (rank, path, is stderr): the RankProcesses' own list
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, str] = {}
        self.cut: dict[str, int] = {}          # characters of the current line left out
        self.decoders: dict[str, codecs.IncrementalDecoder] = {}
        self.on_output = on_output
        self.last_error_line: dict[int, str] = {}

    def poll(self, final: bool = False) -> None:
        for rank, path, is_err in list(self.logs):
            while True:
                try:
                    with open(path, "rb") as f:
                        f.seek(self.offsets.get(path, 0))
                        data = f.read(READ_CHUNK)
                except FileNotFoundError:
                    break
                self.offsets[path] = self.offsets.get(path, 0) + len(data)
                decoder = self.decoders.setdefault(path, codecs.getincrementaldecoder("utf-8")("replace"))
                self._lines(rank, path, is_err, decoder.decode(data, final=final and not data))
                if not final or not data:  # at the end, read all that is left; else a chunk a poll
                    break
            if final and (self.partial.get(path) or self.cut.get(path)):
                self._show(rank, path, is_err, self.partial.pop(path, ""))

    def _lines(self, rank: int, path: str, is_err: bool, text: str) -> None:
        lines = (self.partial.get(path, "") + text).split("\n")
        last = lines.pop()
        for line in lines:
            self._show(rank, path, is_err, line)
        if len(last) > MAX_LINE:
            self.cut[path] = self.cut.get(path, 0) + len(last) - MAX_LINE
            last = last[:MAX_LINE]
        self.partial[path] = last

    def _show(self, rank: int, path: str, is_err: bool, line: str) -> None:
        cut = self.cut.pop(path, 0) + max(len(line) - MAX_LINE, 0)
        line = line[:MAX_LINE] + (f" … ({cut:,} more characters not shown)" if cut else "")
        if is_profiler_banner(line):
            return
        self.on_output(rank, line, is_err)
        if is_err and line.strip():
            self.last_error_line[rank] = line.strip()

def show_rank_line(rank: int, line: str, is_err: bool) -> None:
    """The default: each line printed as it comes, ``[rank R]`` first, to stdout or stderr as written."""
    print(f"[rank {rank}] {line}", file=sys.stderr if is_err else sys.stdout)
