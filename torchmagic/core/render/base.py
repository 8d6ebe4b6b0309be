"""The base every result object shares: rich display for Jupyter, text for terminals, dicts for code."""

from __future__ import annotations

import base64
import html
import importlib
import json
import os
import weakref
from typing import Any

from ..shell import current_shell

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
REPR_SUMMARY_CHARS = 120  # the headline in a result's repr is cut here

CSS = """<style>
.tm-report{font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:13px;line-height:1.45;
  color:var(--jp-ui-font-color1,#1f2328);max-width:1100px}
.tm-report h4{margin:10px 0 4px;font-size:13px}
.tm-headline{font-weight:600;font-size:14px}
.tm-note{color:var(--jp-ui-font-color2,#59636e)}
.tm-table{border-collapse:collapse;font-variant-numeric:tabular-nums;margin:2px 0 6px}
.tm-table th,.tm-table td{padding:2px 10px;border-bottom:1px solid var(--jp-border-color2,#e5e7eb);
  white-space:nowrap}
.tm-table th{font-weight:600}
.tm-omitted{color:var(--jp-ui-font-color2,#59636e);font-style:italic}
.tm-finding{border-left:4px solid #999;padding:4px 10px;margin:6px 0;background:var(--jp-layout-color1,#fff)}
.tm-finding.high{border-color:#d1242f}.tm-finding.medium{border-color:#bf8700}.tm-finding.low{border-color:#0969da}
.tm-sev{font-size:11px;font-weight:700;text-transform:uppercase;padding:0 5px;border-radius:3px;color:#fff}
.tm-sev.high{background:#d1242f}.tm-sev.medium{background:#9a6700}.tm-sev.low{background:#0969da}
.tm-finding pre,.tm-report pre{background:var(--jp-layout-color2,#f6f8fa);padding:6px 8px;margin:4px 0;
  font-size:12px;overflow-x:auto}
.tm-bar{font-family:var(--jp-code-font-family,monospace);line-height:1}
</style>"""


class Result:
    """A measurement: data first, with text, HTML and widget views derived from it."""

    def to_dict(self) -> dict:
        raise NotImplementedError

    def interrupted_line(self) -> str:
        """One line on what was measured, for a run a Ctrl-C cut short."""
        return "interrupted: what was measured is below"

    # The module beside the result's own that renders it: functions text(r), html(r) and, where the
    # view builds tabs, widget(r).  It imports the result only for type checking, so the result
    # imports it when first shown, never the other way round.
    _view_module = "view"

    def _view(self):
        """The result's view module, imported on first use."""
        return importlib.import_module(f".{self._view_module}", type(self).__module__.rpartition(".")[0])

    def to_text(self) -> str:
        return self._view().text(self)

    def to_html(self) -> str:
        return self._view().html(self)

    def widget(self):
        """An ipywidgets view; views build tabs, the default wraps the HTML."""
        view = self._view()
        if hasattr(view, "widget"):
            return view.widget(self)
        import ipywidgets

        return ipywidgets.HTML(self.to_html())

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        """The text report: what ``print(result)`` shows in a script or terminal."""
        return self.to_text()

    def __repr__(self) -> str:
        """One short line: the class and its headline (the report itself is ``str(result)``).
        Results are dataclasses: each declares ``repr=False`` or its own ``__repr__``, so that a
        repr never dumps every field."""
        try:
            summary = " ".join(self.headline().split()) if hasattr(self, "headline") else ""
        except Exception:  # a repr must never raise: it is what a debugger or a log shows
            summary = ""
        if len(summary) > REPR_SUMMARY_CHARS:
            summary = summary[:REPR_SUMMARY_CHARS - 1] + "…"
        return f"<{type(self).__name__}: {summary}>" if summary else f"<{type(self).__name__}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        bundle = {"text/plain": self.to_text(), "text/html": self.to_html()}
        if widget_frontend():
            try:
                bundle[WIDGET_MIME] = _shown_widget(self)._repr_mimebundle_()[WIDGET_MIME]
            except Exception:  # a broken widget view must never hide the result
                pass
        return bundle

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self.to_text())


def report_html(body: str) -> str:
    """HTML made self-contained: the stylesheet, then the body in the report's frame."""
    return f'{CSS}<div class="tm-report">{body}</div>'


def png_img(png: bytes | None, alt: str) -> str:
    """A PNG inlined as a data URI (no file, no server), or nothing."""
    if not png:
        return ""
    return (f'<img alt="{html.escape(alt)}" style="max-width:100%" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode()}"/>')


def tabbed(pages: list[tuple[str, Any]]):
    """An ipywidgets Tab; each page is an HTML body (str), a picture (PNG bytes) or a widget."""
    import ipywidgets as w

    def child(page):
        if isinstance(page, bytes):
            return w.Image(value=page, format="png", layout=w.Layout(max_width="100%"))
        return w.HTML(report_html(page)) if isinstance(page, str) else page

    children = [child(page) for _, page in pages]
    tab = w.Tab(children=children)
    for i, (title, _) in enumerate(pages):
        tab.set_title(i, title)
    return tab


def widget_frontend() -> bool:
    """True where a live widget view can be shown: a Jupyter kernel driven by an interactive frontend.

    Headless executors (nbconvert --execute, papermill, nbval) send their requests with stdin
    off and have no widget manager: what they save must read without a kernel, so they get the
    HTML view, as do frontends without widgets (GitHub, nbviewer), which skip the widget MIME
    type.  Terminal IPython and plain Python get text only.  TORCHMAGIC_WIDGETS=0 or 1 overrides
    the guess inside a kernel (1 for Voila, which executes headless but renders widgets).
    """
    kernel = getattr(current_shell(), "kernel", None)
    if kernel is None:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    forced = os.environ.get("TORCHMAGIC_WIDGETS", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return bool(getattr(kernel, "_allow_stdin", True))


# A result's widget view lives as long as the result, and a result shown while a cell ran lives until
# that cell runs again.  ipywidgets keeps every widget until it is closed, and a report's widgets hold
# its HTML and pictures: each display of an analyze report kept ~0.2 MB for good (9-15 MiB per 50).
# JupyterLab clears a cell's outputs when it runs it again, so its old views are gone by then;
# closing a widget still on screen would blank it, so a display outside any known cell (no cell id:
# a button's callback, a frontend that sends none) keeps its result for the session, as before.
_widgets: dict[int, Any] = {}          # id(result) -> its widget, until the result is collected
_shown_in_cell: dict[str, list] = {}   # cell id -> the results shown while it last ran
_shown_elsewhere: list = []
_shells_watched: set[int] = set()


def _shown_widget(result: Result):
    """The result's widget, built on its first display and kept for the next ones."""
    widget = _widgets.get(id(result))
    if widget is None:
        widget = result.widget()
        try:
            weakref.finalize(result, _close_widget, id(result))
        except TypeError:  # a result that takes no weak reference: a new widget each time, kept
            _shown_elsewhere.append(widget)
            return widget
        _widgets[id(result)] = widget
    _keep_while_shown(result)
    return widget


def _keep_while_shown(result: Result) -> None:
    shell = current_shell()
    running = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    cell = getattr(getattr(running, "info", None), "cell_id", None)
    if not cell:
        if not any(kept is result for kept in _shown_elsewhere):
            _shown_elsewhere.append(result)
        return
    if id(shell) not in _shells_watched:
        shell.events.register("pre_run_cell", _cell_runs_again)
        _shells_watched.add(id(shell))
    shown = _shown_in_cell.setdefault(cell, [])
    if not any(kept is result for kept in shown):
        shown.append(result)


def _cell_runs_again(info) -> None:
    """IPython's pre_run_cell event: the frontend has cleared the cell's outputs."""
    _shown_in_cell.pop(getattr(info, "cell_id", None), None)


def _close_widget(key: int) -> None:
    """Close the widget and every widget it holds (children, layouts, styles): ipywidgets closes
    only the one it is asked to."""
    from ipywidgets import Widget

    pending, seen = [_widgets.pop(key, None)], set()
    while pending:
        widget = pending.pop()
        if not isinstance(widget, Widget) or id(widget) in seen:
            continue
        seen.add(id(widget))
        for name in widget.keys:
            value = getattr(widget, name, None)
            pending.extend(value if isinstance(value, (list, tuple)) else (value,))
        widget.close()
