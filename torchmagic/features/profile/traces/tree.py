"""The nesting of a trace's host events, found over columns rather than with a stack.

The sweep (profile/sweep.py) visits one thread's events by (start, end descending, file order) and keeps a
stack of open events, popping the top while it ended by the next event's start: an event stays open until
everything above it has closed, so its *effective end* is the latest end in its subtree (a child may outlive
its parent).  With effective ends the open events at any start form a chain: an event's depth is the earlier
events whose effective end is after its start (one ending exactly at its start is closed, as ``end <= start``
pops it), and its parent the last earlier event one level up.  Effective ends depend on the parents, so the
two are iterated to a fixed point (once where every child ends within its parent).  Threads are kept apart by
ranking every time and offsetting each thread's ranks past the one before's, so one pass does them all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EventTree:
    """Events in visiting order (``order``: their positions in the columns given), each with its parent's
    index in that order (-1 for none), its depth, and the index of the next event that is not its
    descendant (``after``: where the sweep closes it, innermost first among those closing there)."""

    order: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    after: torch.Tensor

    def levels(self) -> list[torch.Tensor]:
        """The indices at each depth from 1 down (a parent's before its children's)."""
        by_depth = torch.argsort(self.depth, stable=True)
        counts = torch.bincount(self.depth).tolist()
        return list(torch.split(by_depth, counts))[1:]

    def close_order(self) -> torch.Tensor:
        """Indices in the order the sweep closes the events."""
        key = torch.argsort(-self.depth, stable=True)
        return key[torch.argsort(self.after[key], stable=True)]


def event_tree(thread: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> EventTree:
    """The nesting of events given by their thread (small non-negative ids), start and end (any one dtype),
    in the columns' order (the file's, which breaks ties as the sweep's stable sort does)."""
    n = len(start)
    values, ranks = torch.unique(torch.cat([start, end]), sorted=True, return_inverse=True)
    lane = thread.long() * (len(values) + 1)  # each thread's ranks past the one before's
    s, e = ranks[:n] + lane, ranks[n:] + lane
    order = torch.argsort(-e, stable=True)
    order = order[torch.argsort(s[order], stable=True)]
    s, e = s[order], e[order]
    effective, parent = e, None
    while True:
        depth = torch.arange(n) - _closed_before(s, effective)
        parent = _last_one_level_up(depth)
        tree = EventTree(order, parent, depth, torch.empty(0, dtype=torch.long))
        new_effective = e.clone()
        for at in reversed(tree.levels()):  # bottom up: a subtree's latest end
            new_effective.scatter_reduce_(0, parent[at], new_effective[at], reduce="amax")
        if torch.equal(new_effective, effective):
            break
        effective = new_effective
    size = torch.ones(n, dtype=torch.long)
    for at in reversed(tree.levels()):
        size.scatter_add_(0, parent[at], size[at])
    tree.after = torch.arange(n) + size
    return tree


def _closed_before(s: torch.Tensor, effective: torch.Tensor) -> torch.Tensor:
    """Per event (in visiting order), the earlier events closed by its start: effective end before it, or at
    it (a zero-length event at the same start visited earlier).  One sorted key: rank of the effective end,
    then position, searched at (rank of this start, this position), or (rank, 0) where no end equals it."""
    n = len(s)
    values, rank = torch.unique(effective, sorted=True, return_inverse=True)
    keys = torch.sort(rank * n + torch.arange(n)).values
    at = torch.searchsorted(values, s)
    equal = values[at.clamp(max=max(len(values) - 1, 0))] == s
    return torch.searchsorted(keys, at * n + torch.where(equal, torch.arange(n), torch.zeros_like(at)))


def _last_one_level_up(depth: torch.Tensor) -> torch.Tensor:
    """Per event, the last earlier event at one depth less (its parent), or -1 at depth 0."""
    n = len(depth)
    index = torch.arange(n)
    keys = torch.sort(depth * n + index).values
    at = torch.searchsorted(keys, (depth - 1) * n + index) - 1
    found = keys[at.clamp(min=0)]
    has = (depth > 0) & (at >= 0) & (found // n == depth - 1)
    return torch.where(has, found % n, torch.full_like(index, -1))
