"""The notebook variables a rank is sent (``--share``), pickled here and loaded there."""

from __future__ import annotations

import io
import pickle
import traceback
from typing import Any

from ..limits import SettingError


def pickle_shared(shared: dict[str, Any]) -> bytes:
    """The shared variables, each pickled once (a rank loads each back with ``pickle.loads``);
    refused in one line when a rank could not load one: classes and functions the notebook
    defined are pickled by name, and do not exist in a rank."""
    found: list[str] = []

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            module = getattr(obj, "__module__", None) if isinstance(obj, type) or callable(obj) else None
            if module == "__main__" and getattr(obj, "__qualname__", None):
                found.append(obj.__qualname__)
            return None

    pickled: dict[str, bytes] = {}
    for name, value in shared.items():
        found.clear()
        try:
            pickled[name], problem = _pickle_one(_Pickler, value)
        except BaseException:  # a Ctrl-C: this frame stays in its traceback, the values pickled so far not
            pickled.clear()
            raise
        if found:
            problem = (f"uses {', '.join(sorted(set(found)))}, defined in the notebook, which the ranks do not "
                       "have: define it in the cell, or in a module")
        if problem:  # raised here, outside the except: the failed pickling's frames are not kept with it
            pickled.clear()
            raise SettingError("share", f"{name}: {problem}")
    return pickle.dumps(pickled, protocol=pickle.HIGHEST_PROTOCOL)


def _pickle_one(pickler: type[pickle.Pickler], value: Any) -> tuple[bytes, str | None]:
    """``value`` pickled, or why it cannot be.  On any exception (a Ctrl-C too) what the pickling
    had made is dropped first: the exception's traceback, which IPython keeps, holds the frames of
    the pickler and of the objects' ``__reduce__`` (torch's holds a tensor's bytes), and would keep
    their locals alive, the value and its bytes."""
    buffer = io.BytesIO()
    try:
        pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        return buffer.getvalue(), None
    except BaseException as exc:
        buffer.close()
        traceback.clear_frames(exc.__traceback__)
        if not isinstance(exc, Exception):
            raise
        problem = f"cannot be sent to the ranks ({type(exc).__name__}: {exc})"
    return b"", problem

def shared_note(shared: dict[str, Any], blob: bytes) -> str:
    return (f"shared with each rank (pickled, {len(blob) / 2**20:.1f} MiB): {', '.join(sorted(shared))}"
            if shared else "nothing shared from the notebook (--share NAME,... to send variables)")
