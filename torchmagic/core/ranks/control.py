"""Steering ranks one request at a time: a JSON line to every rank, a JSON line back from each.

Each rank has two pipes of its own (RankProcesses(control=True)): requests go down one, replies
come up the other, so the ranks' stdin, stdout and stderr stay the cell's.  While it waits the
notebook shows the ranks' output, and a rank that fails ends the wait with its error.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
from collections.abc import Callable, Iterator

from .output import RankOutput
from .processes import CONTROL_ENV, POLL_S, STOP_GRACE_S, RankFailed, RankProcesses, failure_error


class RankControl:
    """The notebook's end of the control pipes."""

    def __init__(self, ranks: RankProcesses, output: RankOutput):
        self.ranks, self.output = ranks, output
        self._cut_short: int | None = None  # the start whose ranks may still send a reply not read

    def ask(self, request: dict, enough: Callable[[dict], bool] = lambda reply: False) -> dict[int, dict]:
        """Send ``request`` to every rank and wait for each one's reply, or for a reply that is
        ``enough`` to decide (the others may be blocked in a collective it will never join)."""
        if self._cut_short == self.ranks.starts:
            raise RuntimeError("a request was decided before every rank replied: restart the ranks first")
        line = (json.dumps(request) + "\n").encode()
        for commands, _ in self.ranks.channels:
            try:
                os.write(commands, line)  # under PIPE_BUF: written whole, and the pipe has room
            except BrokenPipeError:
                pass  # the rank has ended: the wait below says how
        waiting = {replies: rank for rank, (_, replies) in enumerate(self.ranks.channels)}
        partial = dict.fromkeys(waiting, b"")
        answered: dict[int, dict] = {}
        while waiting:
            ready, _, _ = select.select(list(waiting), [], [], POLL_S)
            self.output.poll()
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                partial[fd] += chunk
                if b"\n" in partial[fd]:
                    reply = json.loads(partial[fd].split(b"\n", 1)[0])
                    answered[waiting.pop(fd)] = reply
                    if enough(reply) and waiting:
                        self._cut_short = self.ranks.starts
                        return answered
                elif not chunk:  # the rank closed its end: it has ended
                    rank = waiting.pop(fd)
                    try:
                        self.ranks.processes[rank].wait(STOP_GRACE_S)
                    except subprocess.TimeoutExpired:
                        pass  # it closed its end and goes on: it is stopped with the others on the way out
                    failure = self.ranks.failed()
                    raise failure_error(self.ranks, self.output, failure) if failure else \
                        RankFailed(rank, 0, "the rank's code ended before the magic was done with it")
            failure = self.ranks.failed()
            if failure is not None:
                raise failure_error(self.ranks, self.output, failure)
        return answered


# -- the rank's end ---------------------------------------------------------------------------

def requests() -> Iterator[dict]:
    """The notebook's requests, one at a time, until it closes the pipe."""
    commands, _ = _fds()
    with os.fdopen(commands, "rb", buffering=0, closefd=False) as pipe:
        for line in iter(pipe.readline, b""):
            yield json.loads(line)


def reply(message: dict) -> None:
    os.write(_fds()[1], (json.dumps(message) + "\n").encode())


def _fds() -> tuple[int, int]:
    commands, replies = os.environ[CONTROL_ENV].split(",")
    return int(commands), int(replies)
