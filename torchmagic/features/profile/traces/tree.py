"""The nesting of a trace's host events, as the sweep (profile/sweep.py) finds it, for the columnar summary.

The sweep visits one thread's events by (start, end descending, file order) and keeps a stack of open
events, popping the top while it ended by the next event's start: so an event stays open until everything
above it has closed (a child may outlive its parent), and its parent is the stack's top when it is visited.
That rule is kept here as it is, in one loop that does nothing else (about 0.1 µs an event on the 2-core
CPU machine, linear however the events overlap): the order is sorted with torch, and everything the summary
derives from the nesting is worked out over columns (columnar_context.py, columnar_totals.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EventTree:
    """Events in visiting order (``order``: their positions in the columns given), each with its parent's
    index in that order (-1 for none), its depth, and the index of the event whose visit closes it
    (``after``: the sweep pops it there, innermost first among those it pops; the thread's end for the last)."""

    order: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    after: torch.Tensor

    def levels(self) -> list[torch.Tensor]:
        """The indices at each depth from 1 down (a parent's before its children's)."""
        by_depth = torch.argsort(self.depth, stable=True)
        counts = torch.bincount(self.depth).tolist() if len(self.depth) else []
        return list(torch.split(by_depth, counts))[1:]

    def close_order(self) -> torch.Tensor:
        """Indices in the order the sweep closes the events."""
        key = torch.argsort(-self.depth, stable=True)
        return key[torch.argsort(self.after[key], stable=True)]


def event_tree(thread: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> EventTree:
    """The nesting of events given by their thread (ids; threads are visited in the order of their ids),
    start and end (floats, compared as the sweep compares them), in the columns' order (the file's, which
    breaks ties as the sweep's stable sort does)."""
    order = torch.argsort(-end, stable=True)
    order = order[torch.argsort(start[order], stable=True)]
    order = order[torch.argsort(thread[order], stable=True)]
    parent, depth, after = _stack(thread[order].tolist(), start[order].tolist(), end[order].tolist())
    return EventTree(order, torch.tensor(parent, dtype=torch.long), torch.tensor(depth, dtype=torch.long),
                     torch.tensor(after, dtype=torch.long))


def _stack(thread: list, start: list[float], end: list[float]) -> tuple[list[int], list[int], list[int]]:
    """The sweep's stack over events in visiting order: each one's parent, depth and closing visit."""
    n = len(start)
    parent, depth, after = [-1] * n, [0] * n, [n] * n
    stack: list[int] = []
    pop, push = stack.pop, stack.append
    current = None
    for i in range(n):
        if thread[i] != current:  # a thread's run ends: what is open closes at its end
            current = thread[i]
            while stack:
                after[pop()] = i
        at = start[i]
        while stack and end[stack[-1]] <= at:
            after[pop()] = i
        if stack:
            parent[i], depth[i] = stack[-1], len(stack)
        push(i)
    return parent, depth, after
