"""Run a code string as IPython would run a cell: statements, then the last expression's value.

Engines call :class:`Cell` with a namespace; the magics pass IPython's own cell
transformer (for ``%magics``, ``!shell`` and friends) and filename cache (so tracebacks
show the cell's source lines).  Nothing here imports IPython.
"""

from __future__ import annotations

import ast
import io
import itertools
import linecache
import tokenize
from collections.abc import Callable
from typing import Any

_counter = itertools.count(1)


class Cell:
    """A compiled cell: ``run(namespace)`` executes it and returns the last expression's value."""

    def __init__(
        self,
        source: str,
        transform: Callable[[str], str] | None = None,
        register_source: Callable[[str], str] | None = None,
    ):
        code = transform(source) if transform else source
        filename = (register_source or _register_in_linecache)(code)
        self.filename = filename
        tree = ast.parse(code, filename)  # a SyntaxError names the cell and line, as IPython's do
        last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if last is not None and _ends_with_semicolon(code):
            last = None  # "x;" displays nothing in IPython: run it as a plain statement
        body = tree.body[:-1] if last is not None else tree.body
        self._body = compile(ast.Module(body=body, type_ignores=[]), filename, "exec")
        self._last = (
            compile(ast.Expression(body=last.value), filename, "eval") if last is not None else None
        )

    @property
    def names(self) -> set[str]:
        """Global names the cell's code refers to (nested functions and comprehensions too)."""
        found: set[str] = set()
        pending = [c for c in (self._body, self._last) if c is not None]
        while pending:
            code = pending.pop()
            found.update(code.co_names)
            pending.extend(c for c in code.co_consts if isinstance(c, type(code)))
        return found

    @property
    def has_value(self) -> bool:
        return self._last is not None

    def run(self, namespace: dict[str, Any]) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython and pytest hide this frame)
        exec(self._body, namespace)
        return eval(self._last, namespace) if self._last is not None else None


def _register_in_linecache(code: str) -> str:
    """Give the source a filename that tracebacks can show lines from."""
    filename = f"<torchmagic-cell-{next(_counter)}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    return filename


def _ends_with_semicolon(code: str) -> bool:
    """Whether the code's last token (comments and blank lines aside) is ``;``: IPython's own test
    (DisplayHook.semicolon_at_end_of_expression, which %%time uses on its cell too).  Tokens, not
    the AST's positions: an end_col_offset counts UTF-8 bytes, not characters (``len("µs");``), and
    str.splitlines splits on more than Python's line ends (a form feed, U+2028)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    for token in reversed(tokens):
        if token.type in (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            continue
        return token.type == tokenize.OP and token.string == ";"
    return False
