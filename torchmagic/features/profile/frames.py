"""Readable names for the Python frames torch's tracer records (``--stack``).

The tracer names a frame ``file(line): function``, where the line is where the function starts
(for a module, where tracing began), not the line that called an op: so the report ranks
functions.  Code typed into a notebook lives in files like /tmp/ipykernel_1/123.py; IPython
knows which cell each came from, and the report says ``In [8]`` as its tracebacks do.
"""

from __future__ import annotations

import os
import re

from ...core.shell import current_shell

_FRAME = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\): (?P<function>.*)$")


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
