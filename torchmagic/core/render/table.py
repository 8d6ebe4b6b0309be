"""A small table that renders as aligned text or HTML, cut to a bounded number of rows."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .format import visible


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[Any], str]
    align: str = "right"  # "left" for names
    optional: bool = False  # left out when no shown row has a value in it ("" or "–")


class Table:
    def __init__(self, columns: Sequence[Column], rows: Sequence[Any], limit: int | None = None,
                 noun: str = "rows", hint: str = ""):
        self.columns = list(columns)
        self.rows = list(rows)
        self.limit = limit
        self.noun = noun
        self.hint = hint

    def _cells(self) -> tuple[list[Column], list[list[str]], int]:
        """The columns worth showing, their cells, and how many rows were cut."""
        shown = self.rows if self.limit is None else self.rows[: self.limit]
        cells = [[visible(c.value(r)) for c in self.columns] for r in shown]  # a name's newline stays in its cell
        keep = [i for i, c in enumerate(self.columns)
                if not c.optional or any(row[i] not in ("", "–") for row in cells)]
        return ([self.columns[i] for i in keep], [[row[i] for i in keep] for row in cells],
                len(self.rows) - len(shown))

    def _omitted_line(self, omitted: int) -> str:
        noun = self.noun[:-1] if omitted == 1 and self.noun.endswith("s") else self.noun
        return f"… {omitted} more {noun} not shown{self.hint}" if omitted else ""

    def to_text(self, indent: str = "  ", max_name: int = 60) -> str:
        columns, cells, omitted = self._cells()
        cells = [[_clip(v, max_name) for v in row] for row in cells]
        headers = [c.header for c in columns]
        widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

        def line(values):
            parts = [v.ljust(w) if c.align == "left" else v.rjust(w)
                     for v, w, c in zip(values, widths, columns)]
            return (indent + "  ".join(parts)).rstrip()

        lines = [line(headers)] + [line(row) for row in cells]
        if omitted:
            lines.append(indent + self._omitted_line(omitted))
        return "\n".join(lines)

    def to_html(self) -> str:
        columns, cells, omitted = self._cells()
        head = "".join(f'<th style="text-align:{c.align}">{html.escape(c.header)}</th>' for c in columns)
        body = "".join(
            "<tr>" + "".join(
                f'<td style="text-align:{c.align}">{html.escape(v)}</td>' for v, c in zip(row, columns)
            ) + "</tr>"
            for row in cells
        )
        foot = (f'<tr><td colspan="{len(columns)}" class="tm-omitted">'
                f"{html.escape(self._omitted_line(omitted))}</td></tr>") if omitted else ""
        return f'<table class="tm-table"><thead><tr>{head}</tr></thead><tbody>{body}{foot}</tbody></table>'


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
