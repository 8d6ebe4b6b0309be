"""Which notebook variables hold tensor memory, without running any of the user's code.

A variable's tensors are found by walking what it refers to: tensors (and their gradients),
modules (parameters, gradients, buffers, tensor attributes, submodules), optimizers (their
state), lists, tuples, sets, dicts, dataclasses and plain objects' ``__dict__``, to a bounded
depth and number of objects.  Memory is counted by storage, so views and tied weights count
once.  Nothing is read through properties or ``__getattr__``: only instance dictionaries and
the containers' own items, fetched with the base types' methods.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...core.gc_pause import gc_paused


MAX_DEPTH = 6              # containers and objects inside a variable (modules' own nesting is free)
MAX_ITEMS = 10_000         # items read from one container
MAX_OBJECTS = 200_000      # objects visited for one report, all variables together

_SKIP_TYPES = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
               str, bytes, bytearray, int, float, complex, bool, type(None), range, memoryview)

StorageKey = tuple[str, int]  # (device, data pointer)


@dataclass
class Holding:
    """The storages reachable from one root, each with its size in bytes."""

    storages: dict[StorageKey, int] = field(default_factory=dict)
    tensors: dict[str, int] = field(default_factory=dict)  # device -> tensors found there
    partial: bool = False  # a limit was reached: there may be more
    # tensors with an autograd graph behind them (grad_fn): the graph's saved tensors are not
    # counted, since reading one runs its unpack hook (user code: checkpointing recomputes there)
    graphs: set[int] = field(default_factory=set)  # their ids


class Walker:
    """Walks roots, sharing one budget of visited objects across them."""

    def __init__(self, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS, max_objects: int = MAX_OBJECTS):
        self.max_depth, self.max_items, self.max_objects = max_depth, max_items, max_objects
        self.visited_total = 0

    def holding(self, root: Any) -> Holding:
        with gc_paused(), torch._C.DisableTorchFunctionSubclass():  # a tensor subclass's hooks are user code too
            return self._holding(root)

    def _holding(self, root: Any) -> Holding:
        found = Holding()
        seen: set[int] = set()
        stack: list[tuple[Any, int]] = [(root, 0)]
        while stack:
            value, depth = stack.pop()
            if id(value) in seen or isinstance(value, _SKIP_TYPES):
                continue
            seen.add(id(value))
            self.visited_total += 1
            if self.visited_total > self.max_objects:
                found.partial = True
                break
            if isinstance(value, torch.Tensor):
                self._tensor(value, found)
                continue
            children = self._children(value, depth, found)
            stack.extend(children)
        return found

    def _tensor(self, tensor: torch.Tensor, found: Holding) -> None:
        device = str(tensor.device)
        found.tensors[device] = found.tensors.get(device, 0) + 1
        for part in _dense_parts(tensor):
            key_size = _storage(part)
            if key_size is not None:
                found.storages[key_size[0]] = key_size[1]
        grad = _grad(tensor)
        if grad is not None:
            self._tensor(grad, found)
        if _has_graph(tensor):
            found.graphs.add(id(tensor))

    def _children(self, value: Any, depth: int, found: Holding) -> list[tuple[Any, int]]:
        if isinstance(value, nn.Module):  # its own nesting does not use up the depth
            attrs = _instance_dict(value)
            items = [*attrs.get("_parameters", {}).values(), *attrs.get("_buffers", {}).values(),
                     *attrs.get("_modules", {}).values()]
            more = [v for k, v in attrs.items() if not k.startswith("_") and not isinstance(v, nn.Module)]
            return [(v, depth) for v in items if v is not None] + [(v, depth + 1) for v in more]
        if isinstance(value, torch.optim.Optimizer):  # its state; the parameters belong to the model
            state = _instance_dict(value).get("state", {})
            return [(slots, depth + 1) for slots in dict.values(state)] if isinstance(state, dict) else []
        if depth >= self.max_depth:
            found.partial = True
            return []
        if isinstance(value, dict):
            items = _limited(dict.values(value), self.max_items, found)
        elif isinstance(value, list | tuple | set | frozenset):
            base = next(b for b in (list, tuple, set, frozenset) if isinstance(value, b))
            items = _limited(base.__iter__(value), self.max_items, found)  # not a subclass's __iter__
        else:
            items = _limited([*_instance_dict(value).values(), *_slot_values(value)], self.max_items, found)
        return [(v, depth + 1) for v in items]


def _limited(values: Iterable[Any], limit: int, found: Holding) -> list[Any]:
    out = []
    for i, v in enumerate(values):
        if i >= limit:
            found.partial = True
            break
        out.append(v)
    return out


def _instance_dict(value: Any) -> dict:
    """The instance's own attributes, read past any __getattribute__ or __getattr__ override."""
    try:
        attrs = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        return {}
    return attrs if isinstance(attrs, dict) else {}


def _slot_values(value: Any) -> list[Any]:
    """Attributes kept in __slots__ (slotted dataclasses), read through their member descriptors
    only, so a property of the same name is never called."""
    out = []
    for cls in type(value).__mro__:
        for name in cls.__dict__.get("__slots__", ()):
            descriptor = cls.__dict__.get(name)
            if isinstance(descriptor, types.MemberDescriptorType):
                try:
                    out.append(descriptor.__get__(value))
                except AttributeError:  # an unset slot
                    pass
    return out


def _grad(tensor: torch.Tensor) -> torch.Tensor | None:
    try:
        return torch.Tensor.grad.__get__(tensor) if tensor.is_leaf else None
    except Exception:  # tensor subclasses without autograd metadata
        return None


def _has_graph(tensor: torch.Tensor) -> bool:
    try:
        return tensor.grad_fn is not None
    except Exception:  # tensor subclasses without autograd metadata
        return False


def _dense_parts(tensor: torch.Tensor) -> list[torch.Tensor]:
    try:
        if tensor.layout == torch.sparse_coo:
            return [tensor._indices(), tensor._values()]
        if tensor.layout in (torch.sparse_csr, torch.sparse_bsr):
            return [tensor.crow_indices(), tensor.col_indices(), tensor.values()]
        if tensor.layout in (torch.sparse_csc, torch.sparse_bsc):
            return [tensor.ccol_indices(), tensor.row_indices(), tensor.values()]
    except Exception:
        return []
    return [tensor]


def _storage(tensor: torch.Tensor) -> tuple[StorageKey, int] | None:
    """The tensor's storage as (key, bytes); None for meta, fake and storage-less tensors."""
    try:
        if tensor.is_meta or type(tensor).__name__ == "FakeTensor":
            return None
        storage = tensor.untyped_storage()
        nbytes, pointer = storage.nbytes(), storage.data_ptr()
    except Exception:  # wrapper subclasses (DTensor, nested) have no single storage
        return None
    if nbytes == 0:
        return None
    return (str(tensor.device), pointer), nbytes


def traceback_locals(tb=None) -> list[Any]:
    """What a traceback's frames hold; by default the last uncaught error's (sys.last_traceback,
    kept for %debug and %tb)."""
    if tb is None:
        tb = getattr(sys, "last_traceback", None)
        exc = getattr(sys, "last_exc", None)
        if tb is None and exc is not None:
            tb = exc.__traceback__
    found = []
    while tb is not None:
        try:
            found.append(dict(tb.tb_frame.f_locals))
        except Exception:
            pass
        tb = tb.tb_next
    return found
