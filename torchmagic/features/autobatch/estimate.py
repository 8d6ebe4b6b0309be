"""Peak-memory estimates of a step from fake tensors: shapes and dtypes only, nothing allocated.

torch's MemTracker follows every tensor the step creates under FakeTensorMode, so a training
step at batch 4096 is "run" in ~0.05 s without a byte of real memory.  Steps that read tensor
values on the host (``.item()``: Adam reads its step count once it has state) cannot run on
fake tensors; then there is no estimate and the search measures real runs instead.  Fake runs
write fake gradients and optimizer state into the real objects, so each is undone at once.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ...core.interrupts import deliver_pending, uninterruptible
from ...core.state import Snapshot
from .search import Probe


def fake_estimator(step: Callable[[int], Any], state: list[Any], snapshot: Callable[[], Snapshot]
                   ) -> Callable[[int], Probe | None] | None:
    """A ``size -> Probe`` estimator for ``step``, or None where fake tensors are unavailable."""
    try:
        with warnings.catch_warnings():  # torch.distributed's import chain warns about TorchScript
            warnings.simplefilter("ignore", DeprecationWarning)
            from torch._subclasses.fake_tensor import FakeTensorMode
            from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:  # builds without torch.distributed (some Windows and mobile builds)
        return None
    @uninterruptible
    def estimate(size: int) -> Probe | None:
        # A Ctrl-C waits for the fake step to end (a second or two at most): raised inside torch's
        # fake-tensor dispatch, which calls Python from C++ where an exception cannot pass, it aborts
        # the whole process ("terminate called after throwing pybind11::error_already_set", seen
        # with nn.GRU on torch 2.13), where a real step would just stop.
        try:
            return fake_step(size)
        finally:
            deliver_pending()

    def fake_step(size: int) -> Probe | None:
        undo = snapshot()
        started = time.perf_counter()
        before_update: list[int] = []  # the peak before the first optimizer update: forward and backward
        hooks = []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with FakeTensorMode(allow_non_fake_inputs=True):
                    tracker = MemTracker()
                    if state:  # count their parameters, gradients and optimizer states too
                        tracker.track_external(*state)
                    hooks = [o.register_step_pre_hook(lambda *_: before_update.append(
                                 _total(tracker.get_tracker_snapshot("peak"))) if not before_update else None)
                             for o in state if isinstance(o, torch.optim.Optimizer)]
                    with tracker:
                        start = _total(tracker.get_tracker_snapshot("current"))
                        step(size)
                        peak = _total(tracker.get_tracker_snapshot("peak"))
                        made = _optimizer_state(tracker.get_tracker_snapshot("current"))
        except Exception:  # data-dependent ops, unsupported kernels: measure for real instead
            return None
        finally:
            _undo(hooks, undo)
        # A trial runs TRIAL_STEPS steps; a second fake one cannot run (Adam reads the step count its
        # first made).  The second's forward and backward run among the optimizer state the first made.
        if before_update:
            peak = max(peak, before_update[0] + made)
        return Probe(size, max(peak - start, 0), True, estimated=True, seconds=time.perf_counter() - started)

    return estimate


@uninterruptible
def _undo(hooks: list, undo: Snapshot) -> None:
    """The optimizers' hooks removed, then the fake run's gradients and optimizer state undone."""
    for hook in hooks:
        hook.remove()
    undo.restore()


def _optimizer_state(snapshot: dict) -> int:
    return int(sum(n for per_device in snapshot.values() for kind, n in per_device.items()
                   if getattr(kind, "name", None) == "OPT"))


def _total(snapshot: dict) -> int:
    return int(sum(per_device.get("Total", 0) for per_device in snapshot.values()))
