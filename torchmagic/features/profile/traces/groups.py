"""A trace's events put in groups of consecutive steps, each group spilled to a private temporary
folder as it is read, to be summarised one group at a time (ops.py): one reading pass whatever the
trace's size, and one group's events held at once.

An event goes to the group its start falls in; a kernel (or copy) to its launch's group where the launch
was read before it (a host ahead of its GPU runs the kernels later: each group's range of launch
correlation ids, which CUPTI numbers in call order, says which group launched one); an
event that begins outside the steps and stays open across a group's start (a Python frame around the
training loop) goes to each group it spans too, so what runs under it there keeps its context."""

from __future__ import annotations

import bisect
import itertools
import math
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator

from ....core.interrupts import HeldScope
from .rank import RankTrace

BATCH = 1024  # records per group written at once (held meanwhile: 0.75 KB each)
DEFERRED = "kernels"  # the file of kernels (and copies) read before their group is known


def group_starts(trace: RankTrace, limit: int) -> list[float]:
    """The start (µs, the file's clock) of each group's first step: about ``limit`` events a group,
    as the trace's steps average them; one group ([]) for a trace within the limit or without steps."""
    if trace.events <= limit or not trace.steps:
        return []
    starts = sorted(start for start, _ in trace.steps.values())
    per_group = max(1, int(limit / (trace.events / len(starts))))
    return starts[::per_group] if per_group < len(starts) else []


class StepGroups(HeldScope):
    """The records of each group: in memory while there is one group, else in a file per group (pickled
    batches) in a private folder, made on entering and deleted on leaving, a Ctrl-C at any point included
    (HeldScope: neither can be split by one)."""

    def __init__(self, trace: RankTrace, starts: list[float], encode, decode):
        """``encode`` makes an event plain values, ``decode`` the event again (pickle, 3x faster to load
        than marshal on these records; only this folder's own files are loaded)."""
        self.encode, self.decode = encode, decode
        self.cuts = [round(start * 1000) for start in starts]  # ns, as records keep their times
        self.count = max(len(starts), 1)
        windows = sorted(trace.steps.values())
        self.steps = [(round(a * 1000), round(b * 1000)) for a, b in windows]
        # per group, the lowest and highest correlation id of its launches: CUPTI numbers them in call order
        self.launches: list[list[int]] = [[] for _ in range(self.count)]
        self.held: list[list] = [[] for _ in range(self.count)]  # events not written yet, per group
        self.events = [0] * self.count  # records per group
        self.deferred: list[tuple] = []  # (group by time, correlation id, plain values) of kernels not placed yet
        self.copies = 0  # records put in a later group too (open across its start)
        self.folder: str | None = None

    def acquire(self) -> StepGroups:
        """Make the private folder, only when there are groups to spill."""
        if self.count > 1:
            self.folder = tempfile.mkdtemp(prefix="torchmagic-trace-")
        return self

    def release(self) -> None:
        """Delete the folder and all it holds."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def add(self, record, start: int, end: int, device: bool, linked: bool, correlation: int) -> None:
        """One event's record, with its start and end (ns), whether it runs on the device, whether it is
        linked to others by ``correlation`` (a launch and its kernels)."""
        group = self._group_of(start)
        if self.count > 1 and linked and correlation:
            if device:  # kineto may write a kernel before its launch: put it in a group once all are read
                self._defer((group, correlation, self.encode(record)))
                return
            seen = self.launches[group]
            seen[:] = [min(seen[0], correlation), max(seen[1], correlation)] if seen else [correlation] * 2
        self._put(group, record)
        if self.count > 1 and not device and end > start and group + 1 < self.count and \
                end > self.cuts[group + 1] and not self._in_step(start):
            for later in range(group + 1, self._group_of(end - 1) + 1):
                self._put(later, record)
                self.copies += 1

    def single(self) -> list | None:
        """With one group, its list of events, which a reader may append to directly (``settle`` counts
        them); None with several."""
        return self.held[0] if self.count == 1 else None

    def settle(self) -> None:
        """Put the kernels read so far in their launch's group (all launches are read)."""
        if self.count == 1:
            self.events[0] = len(self.held[0])
            return
        ranges = sorted((*seen, group) for group, seen in enumerate(self.launches) if seen)
        for batch in itertools.chain(self._batches(DEFERRED), [self.deferred]):  # kernels may be most events
            for group, correlation, values in batch:
                self._put(self._launched_in(correlation, group, ranges), self.decode(values))
        self.deferred = []

    def group(self, index: int) -> list:
        """The events of group ``index``, read back (its file, then what was not written yet)."""
        records = [self.decode(values) for batch in self._batches(f"group{index}") for values in batch]
        records += self.held[index]
        self.held[index] = []
        return records

    def _defer(self, entry: tuple) -> None:
        self.deferred.append(entry)
        if self.folder is not None and len(self.deferred) >= BATCH:
            with open(self._file(DEFERRED), "ab") as file:
                pickle.dump(self.deferred, file, pickle.HIGHEST_PROTOCOL)
            self.deferred = []

    def _batches(self, name: str) -> Iterator[list]:
        """What was written to ``name``'s file, batch after batch."""
        if self.folder is None or not os.path.exists(self._file(name)):
            return
        with open(self._file(name), "rb") as file:
            while True:
                try:
                    yield pickle.load(file)
                except EOFError:
                    return

    def _group_of(self, t: int) -> int:
        return max(bisect.bisect_right(self.cuts, t) - 1, 0)

    def _launched_in(self, correlation: int, group: int, ranges: list[tuple[int, int, int]]) -> int:
        """The group whose launches' correlation ids span ``correlation`` (``ranges``: sorted (lowest,
        highest, group)); else ``group``, by time.  A kernel starts after its launch: never a later group."""
        i = bisect.bisect_right(ranges, (correlation, math.inf, math.inf)) - 1
        if i >= 0 and correlation <= ranges[i][1] and ranges[i][2] <= group:
            return ranges[i][2]
        return group

    def _in_step(self, t: int) -> bool:
        i = bisect.bisect_right(self.steps, (t, math.inf)) - 1
        return i >= 0 and self.steps[i][0] <= t <= self.steps[i][1]

    def _put(self, group: int, record) -> None:
        self.events[group] += 1
        held = self.held[group]
        held.append(record)
        if self.folder is not None and len(held) >= BATCH:
            with open(self._file(f"group{group}"), "ab") as file:
                pickle.dump([self.encode(event) for event in held], file, pickle.HIGHEST_PROTOCOL)
            self.held[group] = []

    def _file(self, name: str) -> str:
        return os.path.join(self.folder, f"{name}.pickle")
