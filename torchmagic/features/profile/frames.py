"""The Python frames torch's tracer records (``--stack``): whose code each is (the user's, an installed
library's) and a readable name for it.

The tracer names a frame ``file(line): function``, where the line is where the function starts
(for a module, where tracing began), not the line that called an op: so the report ranks
functions.  Code typed into a notebook lives in files like /tmp/ipykernel_1/123.py; IPython
knows which cell each came from, and the report says ``In [8]`` as its tracebacks do.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys

from ...core.shell import current_shell

_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<function>.*)$")
_NOT_USER_CODE = ("torch/", "torchmagic/", "IPython/", "ipykernel/", "<built-in", "site-packages/",
                  "dist-packages/", "<frozen", "contextlib.py", "typing.py", "functools.py")


@functools.lru_cache(maxsize=4096)
def is_user_frame(name: str) -> bool:
    """A frame of the user's own code: not torch's, torchmagic's, the standard library's or an installed
    package's (the tracer writes installed files relative to their sys.path entry: transformers/...)."""
    if any(marker in name for marker in _NOT_USER_CODE):
        return False
    top = _top_module(name)
    return top not in sys.stdlib_module_names and not installed_package(top)


@functools.lru_cache(maxsize=4096)
def is_library_frame(name: str) -> bool:
    """A Python frame of an installed third-party package (not torch's own, not a C builtin)."""
    if name.startswith("<") or any(marker in name for marker in _NOT_USER_CODE if marker != "site-packages/"
                                   and marker != "dist-packages/"):
        return False
    return "site-packages/" in name or "dist-packages/" in name or installed_package(_top_module(name))


def _top_module(name: str) -> str:
    return name.replace("\\", "/").split("/", 1)[0].split("(", 1)[0].removesuffix(".py")


@functools.lru_cache(maxsize=1024)
def installed_package(top: str) -> bool:
    """Whether a top-level module is installed into site-packages (or dist-packages), found without importing it."""
    if not top.isidentifier():
        return False
    try:
        spec = importlib.util.find_spec(top)
    except Exception:  # noqa: BLE001 - an imported module's spec is whatever its package made it
        return False
    if spec is None:
        return False
    # transformers 5 puts PosixPath objects in its __path__: read every location as a path, not a str
    where = [spec.origin or "", *(str(p) for p in spec.submodule_search_locations or ())]
    return any("site-packages" in w or "dist-packages" in w for w in where)


def ipython_cell_files() -> dict[str, int]:
    """File name → execution count of the cells compiled in this IPython session (none outside it)."""
    return dict(getattr(getattr(current_shell(), "compile", None), "_filename_map", None) or {})


def frame_label(name: str, cell_files: dict[str, int]) -> str:
    match = _FRAME.match(name)
    if match is None:
        return name
    path, line, function = match["file"], match["line"], match["function"]
    cell = cell_files.get(path)
    where = f"In [{cell}]" if cell is not None else _short(path)
    if function == "<module>":
        return f"{where}, top level"
    return f"{function}  ({where}, line {line})"


def _short(path: str) -> str:
    """A path relative to the working directory when under it, else the last two parts."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        rel = path
    if not rel.startswith(".."):
        return rel
    parts = path.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:])
