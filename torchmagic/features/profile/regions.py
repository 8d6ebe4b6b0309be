"""The parts of a step that train and that evaluate, told apart by autograd's graph.

A notebook cell often trains and then evaluates.  Judged as one step, the evaluation's syncs and small
ops are diluted by the training's (or blamed on it).  Each op called from Python carries autograd's
sequence number: the graph node it made, or, making none, the number the next node will take.  A
backward function carries the number of the forward node it differentiates.  So an op whose number a
backward used belongs to training; one whose number no backward used, to a forward pass whose graph is
never used: evaluation with grad on, if those ops are a forward pass (a few are logging inside training:
``torch.exp(loss).item()``).  An op outside grad mode (number -1: ``no_grad``, the optimizer's
own bookkeeping, gradient clipping) belongs to the part the op before it was in.  An evaluation under
``no_grad`` after training therefore counts with training: nothing in the trace marks it off.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .summary import TraceSummary

TRAINING, EVALUATION = "training", "evaluation"
# the graph nodes an unused forward pass makes at least: fewer are a metric logged from training's outputs
EVALUATION_MIN_NODES = 4


@dataclass
class Part:
    """The ops one part of the step called from Python, over all profiled steps (µs)."""

    name: str
    op_us: list[float] = field(default_factory=list)
    gap_us: float = 0.0        # Python between those ops and the next
    time_us: float = 0.0       # the part's share of the steps: evaluation its ops and Python, training the rest
    sync_calls: int = 0
    sync_us: float = 0.0

    @property
    def ops(self) -> int:
        return len(self.op_us)

    @property
    def median_op_us(self) -> float | None:
        return statistics.median(self.op_us) if self.op_us else None


def parts(s: TraceSummary) -> dict[str, Part] | None:
    """The training and evaluation parts of the steps, or None when they are one: nothing trains, no
    forward pass goes unused, or the summary was built without the per-op lists (from numbers)."""
    n = len(s.python_op_us)
    if not s.backward_events or not n or not (len(s.python_op_nodes) == len(s.python_op_sync)
                                               == len(s.python_gap_us) == n):
        return None
    found = {TRAINING: Part(TRAINING), EVALUATION: Part(EVALUATION)}
    nodes = _nodes_made(s.python_op_nodes)
    for us, part, sync, gap in zip(s.python_op_us, _labels(nodes, s.backward_nodes), s.python_op_sync,
                                   s.python_gap_us):
        current = found[part]
        current.op_us.append(us)
        current.gap_us += gap
        if sync:
            current.sync_calls += 1
            current.sync_us += us
    evaluation = found[EVALUATION]
    if not evaluation.ops:
        return None
    evaluation.time_us = sum(evaluation.op_us) + evaluation.gap_us
    found[TRAINING].time_us = max(s.total_step_us - evaluation.time_us, 0.0)  # with its backward and optimizer
    return found


def _labels(nodes: list[int], used: set[int]) -> list[str]:
    """Each op's part.  A run of ops whose nodes no backward used is evaluation only if it is a forward
    pass, of EVALUATION_MIN_NODES nodes or more; a shorter one is logging inside training
    (``torch.exp(loss).item()``, an accuracy read from the logits) and goes with training."""
    labels, current = [], TRAINING
    for node in nodes:
        if node >= 0:
            current = TRAINING if node in used else EVALUATION
        labels.append(current)
    start = None
    for i, label in enumerate([*labels, TRAINING]):
        if label == EVALUATION and start is None:
            start = i
        elif label != EVALUATION and start is not None:
            if sum(1 for node in nodes[start:i] if node >= 0) < EVALUATION_MIN_NODES:
                labels[start:i] = [TRAINING] * (i - start)
            start = None
    return labels


def _nodes_made(numbers: list[int]) -> list[int]:
    """Each op's number where it made a graph node, else -1.  An op that made none (``.item()``, an op on
    tensors that need no grad) carries the number the next node will take: the same as the next op's.
    Such an op, like the last one, whose number no later op shows to be its own, goes with the op
    before it: the last ``.item()`` of a training loop is not the next forward pass's."""
    made = [-1] * len(numbers)
    following = None  # the number of the next op in grad mode
    for i in range(len(numbers) - 1, -1, -1):
        number = numbers[i]
        if number >= 0:
            if following is not None and following != number:
                made[i] = number
            following = number
    return made
