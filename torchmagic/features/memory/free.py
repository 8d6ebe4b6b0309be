"""``%gpumem --free`` and ``torchmagic.free``: delete variables and what else pins their tensors
(IPython's output history, the last traceback), collect, empty the caches, report what came back."""

from __future__ import annotations

import functools
import gc
import inspect
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ...core.devices import CpuDevice, Device, host_memory, visible_accelerators
from ...core.interrupts import guards
from .holders import Walker
from .pins import Pin, drop_pins, ipython_names, namespace_pins
from .report import holdings, memory_report, user_variables
from .result import Freed, MemoryResult


class NotFreeable(ValueError):
    """Names that are IPython's (its history, exit, get_ipython ...), or code, or hold no tensor memory."""


def _not_memory(value: Any, walker: Walker) -> str | None:
    """Why deleting the name holding ``value`` frees no memory worth a --free, or None: a module, class or
    function is code the notebook goes on using (``import torch`` deleted breaks every later cell), and a
    value holding no tensor has nothing to give back."""
    if isinstance(value, types.ModuleType):
        return "is a module"
    if isinstance(value, type):
        return "is a class"
    if inspect.isroutine(value) or isinstance(value, functools.partial):
        return "is a function"
    if not walker.holding(value).storages:
        return f"holds no tensor memory (it is {type(value).__name__})"
    return None


@guards
def free(names: list[str], namespace: dict[str, Any], *, hidden: Iterable[str] = (),
         devices: list[Device] | None = None, top: int = 10,
         extra_pins: Callable[[], list[Pin]] | None = None) -> MemoryResult:
    """Delete ``names``, drop what else pins their tensors (IPython's output history, the last
    traceback, and ``extra_pins()``: the shell's own copies), collect, empty the caches.

    With no names, drop the pins that hold memory no variable holds (what the report flags).
    A name given twice is freed once; IPython's own names (see ``ipython_names``) are refused,
    nothing freed: deleting Out or _oh would break the shell.
    """
    names = list(dict.fromkeys(names))
    ipython = ipython_names(namespace, hidden)
    theirs = [n for n in names if n in ipython]
    if theirs:
        raise NotFreeable(f"{', '.join(theirs)}: IPython's own, not variables (nothing was freed); "
                          "%gpumem --free with no names drops what only its history holds")
    missing = [n for n in names if n not in namespace]
    if missing:
        raise NameError(f"not defined: {', '.join(missing)}")
    devices = visible_accelerators() if devices is None else devices
    walker = Walker()
    targets: dict[tuple[str, int], int] = {}
    refused = [f"{name} {why}" for name in names if (why := _not_memory(namespace[name], walker)) is not None]
    if refused:
        raise NotFreeable(f"{'; '.join(refused)}: --free deletes variables that hold tensors (nothing was freed)")
    for name in names:
        targets.update(walker.holding(namespace[name]).storages)
    if not names:
        held = set(holdings(user_variables(namespace, hidden), walker).union)
        for pin in namespace_pins(namespace, ipython) + (extra_pins() if extra_pins else []):
            targets.update({k: n for k, n in walker.holding(pin.value).storages.items() if k not in held})
    tensors = [weakref.ref(t) for t in _tensors_of([namespace[n] for n in names])]
    before = {d.label: d.memory_allocated() for d in devices}
    cpu_before = host_memory().rss_bytes
    for name in names:
        del namespace[name]
    pins = namespace_pins(namespace, ipython) + (extra_pins() if extra_pins else [])
    dropped = drop_pins(pins, set(targets), walker)
    del pins  # they hold the values too
    gc.collect()
    for d in [*devices, CpuDevice()]:  # the CPU's: glibc hands freed heap back to the OS
        d.empty_cache()
    reclaimed = {}
    for d in devices:
        after = d.memory_allocated()
        if before[d.label] is not None and after is not None:
            reclaimed[d.label] = before[d.label] - after
    cpu_after = host_memory().rss_bytes
    if cpu_before is not None and cpu_after is not None:
        reclaimed["host, resident"] = cpu_before - cpu_after
    alive = [t for t in (ref() for ref in tensors) if t is not None]
    report = memory_report(namespace, hidden=hidden, devices=devices, top=top,
                           pins=namespace_pins(namespace, ipython_names(namespace, hidden))
                           + (extra_pins() if extra_pins else []))
    report.freed = Freed(names=list(names), dropped=dropped, reclaimed=reclaimed, still_alive_tensors=len(alive),
                         still_alive_bytes=sum(_storage_bytes(t) for t in alive))
    return report


def _tensors_of(values: list[Any]) -> list[torch.Tensor]:
    """The tensors a walk finds, kept only long enough to take weak references."""
    found: list[torch.Tensor] = []

    class Collector(Walker):
        def _tensor(self, tensor, holding):
            found.append(tensor)
            super()._tensor(tensor, holding)

    collector = Collector()
    for value in values:
        collector.holding(value)
    return found


def _storage_bytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:
        return 0
