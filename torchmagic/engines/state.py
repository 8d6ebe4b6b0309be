"""Put the user's model, optimizer and random generators back exactly as they were.

Probing a step (``%autobatch``) runs real forward/backward/optimizer steps; without this it
would train the user's model.  Snapshots live on the CPU, so they do not take device memory
that the measurement is trying to read.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ..devices import Device


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


class Snapshot:
    """Weights, buffers, gradients and optimizer state of the given objects, plus RNG state."""

    def __init__(self, objects: Iterable[Any], device: Device):
        self.device = device
        self.modules = [o for o in objects if isinstance(o, nn.Module)]
        self.optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
        self._modules = [(m, _to_cpu(m.state_dict()), [_to_cpu(p.grad) for p in m.parameters()], m.training)
                         for m in self.modules]
        self._optimizers = [(o, _to_cpu(o.state_dict())) for o in self.optimizers]
        self._rng = device.rng_state()

    def restore(self) -> None:
        with torch.no_grad():
            for module, state, grads, training in self._modules:
                module.load_state_dict(state)
                for param, grad in zip(module.parameters(), grads):
                    param.grad = None if grad is None else grad.to(param.device)
                module.train(training)
        for optimizer, state in self._optimizers:
            optimizer.load_state_dict(state)  # also drops state the probes created lazily
        self.device.set_rng_state(self._rng)


def objects_used_by(fn: Callable, namespace: dict[str, Any] | None = None) -> list[Any]:
    """Modules and optimizers a step can reach: its closure, the globals it names, the object
    a bound method belongs to, and (for a magic) the notebook's top-level variables."""
    found: list[Any] = []

    def add(value):
        if isinstance(value, nn.Module | torch.optim.Optimizer) and not any(value is f for f in found):
            found.append(value)

    target = inspect.unwrap(fn)
    add(getattr(target, "__self__", None))
    code = getattr(target, "__code__", None)
    if code is not None:
        for cell in getattr(target, "__closure__", None) or ():
            try:
                add(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        scope = getattr(target, "__globals__", {})
        for name in code.co_names:
            add(scope.get(name))
    for value in (namespace or {}).values():
        add(value)
    # a module's own optimizer-less parameters are covered by the module; nested modules
    # inside a found module are covered by its state_dict, so keep only the outermost
    modules = [o for o in found if isinstance(o, nn.Module)]
    inner = {id(sub) for m in modules for sub in m.modules() if sub is not m}
    return [o for o in found if id(o) not in inner]
