"""The nesting worked out over columns (traces/tree.py) against the sweep's stack loop as profile/sweep.py runs it,
on events of every shape the loop tells apart: nested, a child outliving its parent, equal starts and ends, no
duration, several threads, times on a coarse grid (many ties) or a fine one."""

from __future__ import annotations

import hypothesis
import torch
from hypothesis import strategies as st

from torchmagic.features.profile.traces.tree import event_tree


def _swept(thread: torch.Tensor, start: torch.Tensor, end: torch.Tensor):
    """The sweep's visiting order and, for each event, its parent, depth and closing visit, by its loop."""
    order = torch.argsort(-end, stable=True)
    order = order[torch.argsort(start[order], stable=True)]
    order = order[torch.argsort(thread[order], stable=True)]
    threads, starts, ends = thread[order].tolist(), start[order].tolist(), end[order].tolist()
    n = len(starts)
    parent, depth, after = [-1] * n, [0] * n, [n] * n
    stack: list[int] = []
    current = None
    for i in range(n):
        if threads[i] != current:  # a thread's run ends: what is open closes at its end
            current = threads[i]
            while stack:
                after[stack.pop()] = i
        while stack and ends[stack[-1]] <= starts[i]:
            after[stack.pop()] = i
        if stack:
            parent[i], depth[i] = stack[-1], len(stack)
        stack.append(i)
    return order, torch.tensor(parent, dtype=torch.long), torch.tensor(depth, dtype=torch.long), \
        torch.tensor(after, dtype=torch.long)


@st.composite
def _events(draw):
    grid = draw(st.sampled_from([3, 20, 10**6]))  # few distinct times (ties everywhere) to nearly none
    n = draw(st.integers(0, 80))
    threads = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    starts = draw(st.lists(st.integers(0, grid), min_size=n, max_size=n))
    lengths = draw(st.lists(st.one_of(st.just(0), st.just(1), st.integers(0, grid)), min_size=n, max_size=n))
    start = torch.tensor(starts, dtype=torch.float64) / 7  # not integers: compared as the floats they are
    return torch.tensor(threads, dtype=torch.long), start, start + torch.tensor(lengths, dtype=torch.float64) / 7


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(_events())
def test_the_nesting_is_the_sweeps(events):
    tree = event_tree(*events)
    order, parent, depth, after = _swept(*events)
    assert torch.equal(tree.order, order)
    assert torch.equal(tree.parent, parent)
    assert torch.equal(tree.depth, depth)
    assert torch.equal(tree.after, after)


def test_deep_and_long_nesting():
    """A chain 3,000 deep (each event inside the one before), then 3,000 siblings under one parent, then a
    staircase of events each outliving the one before: block skipping over long runs, many jumps for depths."""
    chain = torch.arange(3000, dtype=torch.float64)
    siblings = 10_000 + torch.arange(3000, dtype=torch.float64) * 2
    stairs = 20_000 + torch.arange(3000, dtype=torch.float64)
    start = torch.cat([chain, torch.tensor([9_999.0]), siblings, stairs])
    end = torch.cat([6000 - chain, torch.tensor([17_000.0]), siblings + 1, stairs + 2.5])
    thread = torch.zeros(len(start), dtype=torch.long)
    tree = event_tree(thread, start, end)
    order, parent, depth, after = _swept(thread, start, end)
    assert torch.equal(tree.parent, parent) and torch.equal(tree.depth, depth) and torch.equal(tree.after, after)
    assert int(tree.depth.max()) == 2999
