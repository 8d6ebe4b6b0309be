"""What keeps memory alive besides the user's variables, and how to let go of it.

IPython keeps every displayed output (``Out``, ``_N``, ``_``, ``__``, ``___``) and the last
uncaught error's traceback (for ``%debug``); both hold tensors long after the variables that
named them are gone.  The magics add the shell's own copies (the display hook's, the hidden-
names table's, the traceback handler's) through the same :class:`Pin`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .holders import Walker, traceback_locals

HISTORY_NAMES = ("_", "__", "___")


@dataclass
class Pin:
    """Something outside the user's variables that keeps objects alive, and how to let go of it."""

    kind: str                  # "history" or "traceback"
    label: str                 # what the user would call it: Out[3], _, the last traceback
    value: Any
    drop: Callable[[], None]


def namespace_pins(namespace: dict[str, Any]) -> list[Pin]:
    """IPython's output history as the namespace shows it (Out, _N, _, __, ___) and the last
    uncaught error's traceback (sys.last_traceback, kept for %debug and %tb)."""
    pins = []
    out = namespace.get("Out")
    if isinstance(out, dict):
        for key, value in list(out.items()):
            def drop(key=key):
                out.pop(key, None)
                namespace.pop(f"_{key}", None)
            pins.append(Pin("history", f"Out[{key}]", value, drop))
    for name in HISTORY_NAMES:
        if name in namespace:
            pins.append(Pin("history", name, namespace[name], lambda name=name: namespace.__setitem__(name, "")))
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


def drop_pins(pins: list[Pin], targets: set, walker: Walker) -> list[str]:
    """Let go of every pin that reaches one of the freed storages; say which."""
    dropped = []
    for pin in pins:
        if targets & set(walker.holding(pin.value).storages):
            pin.drop()
            if pin.label not in dropped:
                dropped.append(pin.label)
    return dropped
