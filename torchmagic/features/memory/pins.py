"""What keeps memory alive besides the user's variables, and how to let go of it.

IPython keeps every displayed output (``Out``, ``_N``, ``_``, ``__``, ``___``) and the last
uncaught error's traceback (for ``%debug``); both hold tensors long after the variables that
named them are gone.  The magics add the shell's own copies (the display hook's, the hidden-
names table's, the traceback handler's) through the same :class:`Pin`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...core.shell import current_shell, is_history
from .holders import Walker, traceback_locals

HISTORY_NAMES = ("_", "__", "___")
# What Python puts in every module's namespace, a notebook's included
MODULE_NAMES = frozenset({"__name__", "__doc__", "__package__", "__loader__", "__spec__", "__builtin__",
                          "__builtins__"})


def ipython_names(namespace: dict[str, Any], hidden: Iterable[str] | Mapping[str, Any] = ()) -> set[str]:
    """The names of ``namespace`` that hold what IPython (or Python) put there, not the user's.

    IPython records what it puts in a notebook's namespace (In, Out, _oh, _ih, _dh, _, __, ___,
    _N, _i, _ii, _iii, _iN, exit, quit, get_ipython, open) in ``shell.user_ns_hidden``, with the
    value.  A name is IPython's while it still holds that very value; once the user binds it
    (``_ = model(x)``) it is the user's.  This is IPython's own test: its display hook stops
    updating ``_`` when the user has assigned it.  Given no values (a namespace no shell owns, as
    a script's dict that mimics one), every hidden name and every name shaped like IPython's
    history (``_``, ``__``, ``_3``, ``_i``, ``Out``) counts as IPython's, to be safe."""
    shell = current_shell()
    if not isinstance(hidden, Mapping) and namespace is getattr(shell, "user_ns", None):
        hidden = shell.user_ns_hidden
    if isinstance(hidden, Mapping):
        own = {name for name, value in hidden.items() if name in namespace and namespace[name] is value}
    else:
        names = set(hidden)
        own = {name for name in namespace if name in names or is_history(name)}
    return own | (MODULE_NAMES & namespace.keys())


@dataclass
class Pin:
    """Something outside the user's variables that keeps objects alive, and how to let go of it."""

    kind: str                  # "history" or "traceback"
    label: str                 # what the user would call it: Out[3], _, the last traceback
    value: Any
    drop: Callable[[], None]


def namespace_pins(namespace: dict[str, Any], ipython: set[str] | None = None) -> list[Pin]:
    """IPython's output history as the namespace shows it (Out, _N, _, __, ___) and the last
    uncaught error's traceback (sys.last_traceback, kept for %debug and %tb).  ``ipython``: the
    names that are IPython's (:func:`ipython_names`); a user's own ``_`` or ``_3`` is never a pin."""
    ipython = set(namespace) if ipython is None else ipython
    pins = []
    out = namespace.get("Out")
    if isinstance(out, dict) and "Out" in ipython:
        for key, value in list(out.items()):
            def drop(key=key):
                out.pop(key, None)
                if f"_{key}" in ipython:
                    namespace.pop(f"_{key}", None)
            pins.append(Pin("history", f"Out[{key}]", value, drop))
    for name in HISTORY_NAMES:
        if name in namespace and name in ipython:
            pins.append(Pin("history", name, namespace[name], lambda name=name: _forget(namespace, name)))
    frames = traceback_locals()
    if frames:
        def forget_error():
            for error in (getattr(sys, "last_value", None), getattr(sys, "last_exc", None)):
                if isinstance(error, BaseException):
                    error.__traceback__ = None  # whoever else keeps the exception keeps no frames
            for attr in ("last_type", "last_value", "last_traceback", "last_exc"):
                if hasattr(sys, attr):
                    setattr(sys, attr, None)
        pins.append(Pin("traceback", "the last traceback", frames, forget_error))
    return pins


def _forget(namespace: dict[str, Any], name: str) -> None:
    """Empty IPython's ``_``, ``__`` or ``___`` in the namespace and in the shell's table of its own
    values alike: were they to differ, IPython would take the name for the user's and stop updating it."""
    namespace[name] = ""
    shell = current_shell()
    if namespace is getattr(shell, "user_ns", None) and name in shell.user_ns_hidden:
        shell.user_ns_hidden[name] = ""


def drop_pins(pins: list[Pin], targets: set, walker: Walker) -> list[str]:
    """Let go of every pin that reaches one of the freed storages; say which."""
    dropped = []
    for pin in pins:
        if targets & set(walker.holding(pin.value).storages):
            pin.drop()
            if pin.label not in dropped:
                dropped.append(pin.label)
    return dropped
