"""Put the user's model, optimizer and random generators back exactly as they were.

Probing a step (``%autobatch``) runs real forward/backward/optimizer steps; without this it
would train the user's model.  Snapshots live on the CPU, so they do not take device memory
that the measurement is trying to read.
"""

from __future__ import annotations

import copy
import functools
import inspect
import random
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import torch
from torch import nn

from .devices import Device
from .interrupts import deliver_pending, uninterruptible


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _other_stateful(value) -> bool:
    """Objects besides modules and optimizers whose state a training step advances."""
    return isinstance(value, torch.optim.lr_scheduler.LRScheduler | torch.amp.GradScaler)


def is_stateful(value) -> bool:
    return isinstance(value, nn.Module | torch.optim.Optimizer) or _other_stateful(value)


class Generators:
    """The random generators a user's code draws from: torch's on the device (and the CPU), Python's
    ``random`` and NumPy's global one where NumPy is loaded (a dataset's augmentations often use them)."""

    def __init__(self, device: Device):
        self.device = device
        self._torch = device.rng_state()
        self._python = random.getstate()
        numpy = sys.modules.get("numpy")
        self._numpy = numpy.random.get_state() if numpy is not None else None

    @uninterruptible
    def restore(self) -> None:
        self.device.set_rng_state(self._torch)
        random.setstate(self._python)
        if self._numpy is not None:
            sys.modules["numpy"].random.set_state(self._numpy)
        deliver_pending()


class Snapshot:
    """Weights, buffers, gradients and optimizer state of the given objects (and the state of
    learning-rate schedulers and gradient scalers among them), plus the random generators."""

    def __init__(self, objects: Iterable[Any], device: Device):
        objects = list(objects)
        self.device = device
        self.modules = [o for o in objects if isinstance(o, nn.Module)]
        self.optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
        self._modules = [(m, _to_cpu(m.state_dict()), [_to_cpu(p.grad) for p in m.parameters()], m.training)
                         for m in self.modules]
        self._optimizers = [(o, _to_cpu(o.state_dict())) for o in self.optimizers]
        self._others = [(o, _to_cpu(o.state_dict())) for o in objects if _other_stateful(o)]
        self._generators = Generators(device)

    @uninterruptible
    def restore(self) -> None:
        """Put everything back; can be called any number of times.  A Ctrl-C waits until all is
        back (torchmagic/interrupts.py).

        What is handed over is always a fresh copy: an optimizer keeps the tensors it loads
        (``step``, and moments already on the right device) and updates them in place, and a
        gradient is accumulated into in place, which would otherwise change the snapshot.
        """
        with torch.no_grad():
            for module, state, grads, training in self._modules:
                module.load_state_dict(state)  # copies into the existing tensors
                for param, grad in zip(module.parameters(), grads):
                    param.grad = None if grad is None else grad.to(param.device, copy=True)
                module.train(training)
        for optimizer, state in self._optimizers:
            optimizer.load_state_dict(copy.deepcopy(state))  # also drops state the probes created lazily
        for other, state in self._others:
            other.load_state_dict(copy.deepcopy(state))
        self._generators.restore()
        deliver_pending()


def referenced_values(fn: Callable) -> list[Any]:
    """What a function can reach without arguments: the object a bound method belongs to, its
    closure, and the globals its code names (through ``functools.partial``: its arguments too)."""
    target = inspect.unwrap(fn)
    if isinstance(target, functools.partial):
        return [target.func, *target.args, *target.keywords.values(), *referenced_values(target.func)]
    found = [getattr(target, "__self__", None)]
    code = getattr(target, "__code__", None)
    if code is not None:
        for cell in getattr(target, "__closure__", None) or ():
            try:
                found.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        scope = getattr(target, "__globals__", {})
        found += [scope.get(name) for name in code.co_names]
    return [v for v in found if v is not None]


def names_reached(fn: Callable) -> dict[str, Any]:
    """The names a function's code uses for what it reaches (its closure's and the globals'), with
    their values: what the user calls those objects."""
    target = inspect.unwrap(fn)
    code = getattr(target, "__code__", None)
    if code is None:
        return {}
    found = {}
    for name, cell in zip(code.co_freevars, getattr(target, "__closure__", None) or ()):
        try:
            found[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    scope = getattr(target, "__globals__", {})
    found.update({name: scope[name] for name in code.co_names if name in scope})
    return found


def names_used(names: Iterable[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """What a cell's names refer to, with the names the functions among them use for what they reach
    (a cell calling ``train(model)`` or ``step()`` that uses ``opt``): how the user calls each object."""
    found = {n: namespace[n] for n in sorted(names) if n in namespace}
    for value in list(found.values()):
        if inspect.isfunction(value) or inspect.ismethod(value):
            for name, reached in names_reached(value).items():
                found.setdefault(name, reached)
    return found


def values_named(names: Iterable[str], namespace: dict[str, Any]) -> list[Any]:
    """The values a cell's names refer to, and what the functions among them reach: where the
    cell's work happens (its model and tensors, or those of the step it calls)."""
    values = [namespace[n] for n in sorted(names) if n in namespace]
    return values + [v for f in values if inspect.isfunction(f) or inspect.ismethod(f) for v in referenced_values(f)]


def objects_used_by(values: Iterable[Any]) -> list[Any]:
    """The modules, optimizers, schedulers and gradient scalers a step can change, found from the
    values its code names (``referenced_values(step)``, or a cell's names): those values, what the
    functions among them reach in turn (a step calling ``train_one(model, opt)``), and the stateful
    attributes of plain objects (a trainer holding its model).  The magics and the API both choose
    what to restore this way, so ``%autobatch step`` and ``torchmagic.autobatch(step)`` agree."""
    found: list[Any] = []
    seen: set[int] = set()
    pending = [(value, 0) for value in values]
    while pending:
        value, depth = pending.pop(0)
        if id(value) in seen:
            continue
        seen.add(id(value))
        if is_stateful(value):
            found.append(value)
        elif depth < _REACH_DEPTH:
            pending += [(v, depth + 1) for v in _reaches(value)]
    return outermost(found)


_REACH_DEPTH = 3  # step -> helper -> helper's helper: notebooks rarely nest deeper


def _reaches(value: Any) -> list[Any]:
    """What a function or plain object can hand a step: not library code (torch's own functions
    reach no user state, and walking them is slow)."""
    if inspect.isfunction(value) or inspect.ismethod(value) or isinstance(value, functools.partial):
        module = getattr(inspect.unwrap(getattr(value, "func", value)), "__module__", None) or ""
        if module.split(".")[0] in _LIBRARIES:
            return []
        if isinstance(value, functools.partial):
            return [value.func, *value.args, *value.keywords.values()]
        return referenced_values(value)
    if isinstance(value, torch.Tensor | type | ModuleType):
        return []
    attributes = getattr(value, "__dict__", None)
    return list(attributes.values()) if isinstance(attributes, dict) else []


_LIBRARIES = {"torch", "torchmagic", "functools", "numpy", "builtins"}


def objects_for_model(model: nn.Module, names: Iterable[str], namespace: dict[str, Any]) -> list[Any]:
    """What a cell built around ``model`` can change: the model, the stateful objects the cell
    names, and the optimizers holding the model's parameters (with their schedulers)."""
    found: list[Any] = [model]

    def add(value):
        if is_stateful(value) and not any(value is f for f in found):
            found.append(value)

    for name in names:
        add(namespace.get(name))
    params = {id(p) for p in model.parameters()}
    optimizers = [v for v in namespace.values() if isinstance(v, torch.optim.Optimizer)
                  and any(id(p) in params for group in v.param_groups for p in group["params"])]
    for optimizer in optimizers:
        add(optimizer)
    for value in namespace.values():
        if isinstance(value, torch.optim.lr_scheduler.LRScheduler) and any(value.optimizer is o for o in optimizers):
            add(value)
    return outermost(found)


def outermost(found: list[Any]) -> list[Any]:
    """Without the modules nested in another found module (its state_dict covers them)."""
    # a module's own optimizer-less parameters are covered by the module; nested modules
    # inside a found module are covered by its state_dict, so keep only the outermost
    modules = [o for o in found if isinstance(o, nn.Module)]
    inner = {id(sub) for m in modules for sub in m.modules() if sub is not m}
    return [o for o in found if id(o) not in inner]
