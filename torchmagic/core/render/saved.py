"""A result saved to a file and loaded back, in another process or another day: ``result.save(path)``
and ``torchmagic.load(path)``.

The file is JSON (gzipped where the name ends in ``.gz``): the result's ``to_dict()`` with its type
and the torchmagic version that wrote it.  Loading rebuilds the dataclass from its fields' types
(nested results, tuples, optional values, enums saved as their values), so a loaded result is the
same plain data, shown and compared (``--diff``) as the one saved.  Keys a result derives in
``to_dict`` (``median_step_s``) are not fields and are left out; a field a later version added takes
its default; a class whose saved shape changed (a description once kept as a plain dict) turns an
earlier file's data into today's with its ``upgrade_saved(data)``.
"""

from __future__ import annotations

import dataclasses
import enum
import gzip
import json
import types
import typing
from pathlib import Path
from typing import Any

from ..._version import __version__

FORMAT = "torchmagic-result"
VERSION = 1

_TYPES: dict[str, type] = {}  # result classes by name: what a file says it holds


def register(cls: type) -> type:
    """A result class a file can hold (each Result subclass registers itself)."""
    _TYPES[cls.__name__] = cls
    return cls


class NotAResultFile(ValueError):
    """The file is not a result torchmagic saved (or not one of the kind asked for)."""


def save(result, path: str | Path) -> Path:
    path = Path(path)
    document = {"format": FORMAT, "version": VERSION, "type": type(result).__name__, "torchmagic": __version__,
                "result": result.to_dict()}
    text = json.dumps(document)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def load(path: str | Path, kind: type | None = None):
    """The result saved in ``path``; ``kind``: the class it must be (else NotAResultFile)."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        document = json.loads(raw)
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotAResultFile(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise NotAResultFile(f"{path}: not a result saved by torchmagic (result.save(path) writes one)")
    if document.get("version") != VERSION:
        raise NotAResultFile(f"{path}: saved in format version {document.get('version')}; this torchmagic "
                             f"reads version {VERSION}")
    cls = _TYPES.get(document.get("type"))
    if cls is None or (kind is not None and not issubclass(cls, kind)):
        wanted = f", not a {kind.__name__}" if kind is not None else ""
        raise NotAResultFile(f"{path}: holds a result of type {document.get('type')}{wanted}")
    return from_data(cls, document["result"])


def from_data(cls: type, data: Any) -> Any:
    """``data`` (what ``to_dict`` and JSON made of a ``cls``) as a ``cls`` again."""
    if data is None:
        return None
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return cls(data)
    if dataclasses.is_dataclass(cls):
        if hasattr(cls, "upgrade_saved"):  # a class whose saved shape changed reads the earlier one too
            data = cls.upgrade_saved(data)
        hints = typing.get_type_hints(cls)
        values = {f.name: from_data(hints[f.name], data[f.name])
                  for f in dataclasses.fields(cls) if f.init and f.name in data}
        return cls(**values)
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return from_data(kinds[0], data) if len(kinds) == 1 else data
    if origin is list:
        return [from_data(args[0], item) for item in data] if args else list(data)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_data(args[0], item) for item in data)
        return tuple(from_data(a, item) for a, item in zip(args, data)) if args else tuple(data)
    if origin is dict:
        return {key: from_data(args[1], value) for key, value in data.items()} if args else dict(data)
    if cls is float and isinstance(data, int):
        return float(data)
    return data
