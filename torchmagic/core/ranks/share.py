"""The notebook variables a rank is sent (``--share``), pickled here and loaded there."""

from __future__ import annotations

import io
import pickle
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

    pickled = {}
    for name, value in shared.items():
        found.clear()
        buffer = io.BytesIO()
        try:
            _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        except Exception as exc:
            if not found:
                raise SettingError("share", f"{name}: cannot be sent to the ranks ({type(exc).__name__}: {exc})") from None
        if found:
            raise SettingError("share", f"{name}: uses {', '.join(sorted(set(found)))}, defined in the notebook, "
                                        "which the ranks do not have: define it in the cell, or in a module")
        pickled[name] = buffer.getvalue()
    return pickle.dumps(pickled, protocol=pickle.HIGHEST_PROTOCOL)


def shared_note(shared: dict[str, Any], blob: bytes) -> str:
    return (f"shared with each rank (pickled, {len(blob) / 2**20:.1f} MiB): {', '.join(sorted(shared))}"
            if shared else "nothing shared from the notebook (--share NAME,... to send variables)")
