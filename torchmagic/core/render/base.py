"""The base every result object shares: rich display for Jupyter, text for terminals, dicts for code."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import uuid
import weakref
from pathlib import Path
from typing import Any, Callable

from ..shell import current_shell
from . import saved
from .format import visible

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
REPR_SUMMARY_CHARS = 120  # the headline in a result's repr is cut here
VIEW_WHITESPACE = "\n\t"  # the control characters a view's own layout uses

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
.tm-report pre,.tm-report code{font-family:var(--jp-code-font-family,Menlo,Consolas,"DejaVu Sans Mono",monospace)}
.tm-bar{font-family:var(--jp-code-font-family,monospace);line-height:1}
.tm-tabs{display:flex;flex-wrap:wrap;align-items:flex-end}
.tm-tabs>input{position:absolute;opacity:0;width:1px;height:1px}
.tm-tabs>label{order:0;padding:3px 12px;margin:0 2px -1px 0;cursor:pointer;color:var(--jp-ui-font-color2,#59636e);
  border:1px solid transparent;border-bottom:none}
.tm-tabs>input:checked+label{color:var(--jp-ui-font-color1,#1f2328);font-weight:600;
  border-color:var(--jp-border-color2,#e5e7eb);background:var(--jp-layout-color1,#fff)}
.tm-tabs>input:focus-visible+label{outline:2px solid #0969da}
.tm-tabs>.tm-page{order:1;width:100%;border-top:1px solid var(--jp-border-color2,#e5e7eb);padding-top:4px}
.tm-tabs>input:not(:checked)+label+.tm-page{display:none}
</style>"""


class Result:
    """A measurement: data first, with text and HTML views derived from it.

    The HTML is the report everywhere, live or saved: it needs no kernel, so a notebook reopened
    tomorrow, in JupyterLab, Notebook, VS Code or on GitHub, shows what the cell showed.  What only
    a live kernel can do (a view's buttons) is a second output below it (``controls``)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        saved.register(cls)  # a file that says it holds one can be loaded back

    def to_dict(self) -> dict:
        raise NotImplementedError

    def save(self, path: str | os.PathLike) -> Path:
        """Write the result to ``path`` (JSON; gzipped where the name ends in .gz):
        ``torchmagic.load(path)`` reads it back, in any process, and ``%%torchprofile --diff PATH``
        compares with a profile saved so."""
        return saved.save(self, path)

    def interrupted_line(self) -> str:
        """One line on what was measured, for a run a Ctrl-C cut short."""
        return "interrupted: what was measured is below"

    def _view(self):
        """The module that renders the result: functions text(r), html(r) and, where the live view has
        buttons, has_controls(r) and controls(r, show_below).  Each result imports its own inside this
        method: the view imports the result only for type checking, so the result imports it when first
        shown, never the other way round."""
        raise NotImplementedError

    def headline(self) -> str:
        """The report's first line: what the result says, in one line."""
        return self._view().headline(self)

    # Every view's output goes through visible(): a name from the user's code (a module, a variable, a
    # record_function range, an exception's message) may hold terminal escapes, shown here, never acted on.
    def to_text(self) -> str:
        return visible(self._view().text(self), keep=VIEW_WHITESPACE)

    def to_html(self) -> str:
        return visible(self._view().html(self), keep=VIEW_WHITESPACE)

    def controls(self, show_below: Callable[[dict], None]):
        """The live view's ipywidgets controls (a finding's verify buttons), or None.  ``show_below``
        puts a MIME bundle in the output under them, one that lasts (not a widget)."""
        view = self._view()
        return view.controls(self, show_below) if hasattr(view, "controls") else None

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
            summary = " ".join(visible(self.headline()).split())
        except Exception:  # a repr must never raise: it is what a debugger or a log shows
            summary = ""
        if len(summary) > REPR_SUMMARY_CHARS:
            summary = summary[:REPR_SUMMARY_CHARS - 1] + "…"
        return f"<{type(self).__name__}: {summary}>" if summary else f"<{type(self).__name__}>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """The text, and the HTML only where the frontend shows it: IPython's include/exclude and the
        shell's active types (terminal IPython shows text/plain alone, so no HTML or picture is drawn
        there).  Each is built once per result: showing it again, or a live view asking twice, reuses it."""
        shown = shown_types(include, exclude)
        bundle = {}
        if "text/plain" in shown:
            bundle["text/plain"] = self._built("text/plain", self.to_text)
        if "text/html" in shown:
            bundle["text/html"] = fresh_tab_groups(self._built("text/html", self.to_html))
        return bundle

    def _built(self, mime: str, build: Callable[[], str]) -> str:
        """``build()``, kept in a cache beside the fields (not a field: equality, to_dict, copies and
        pickles never see it).  A result is data built once, so what it shows never goes stale."""
        cache = self.__dict__.get(_DISPLAY_CACHE)
        if cache is None:
            cache = {}
            object.__setattr__(self, _DISPLAY_CACHE, cache)  # frozen or not, the fields stay as built
        if mime not in cache:
            cache[mime] = build()
        return cache[mime]

    def __getstate__(self) -> dict:
        """What pickle and copy keep: the fields, never the display cache."""
        return {k: v for k, v in self.__dict__.items() if k != _DISPLAY_CACHE}

    @property
    def _ipython_display_(self):
        """IPython shows a result through this method where it is callable: only where a live view
        has controls to add.  Elsewhere it is None, and IPython shows the bundle as usual (the
        value of a cell stays an execute_result, Out[n])."""
        view = self._view()
        if not widget_frontend() or not hasattr(view, "controls") or not view.has_controls(self):
            return None
        return lambda: _display_with_controls(self)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self._built("text/plain", self.to_text))


_DISPLAY_CACHE = "_shown_as"  # the instance attribute holding a result's built text and HTML, by MIME type
_TAB_GROUP = re.compile(r"tm-tabs-[0-9a-f]{12}")
_BUNDLE_TYPES = ("text/plain", "text/html")


def shown_types(include=None, exclude=None) -> set[str]:
    """The MIME types of a result's bundle that the frontend will show: those IPython's display asks
    for (include, less exclude), of those the running shell's formatter has active; without a shell
    (a script calling _repr_mimebundle_), both."""
    types = set(_BUNDLE_TYPES if include is None else include) & set(_BUNDLE_TYPES)
    formatter = getattr(current_shell(), "display_formatter", None)
    active = getattr(formatter, "active_types", None)
    if active is not None:
        types &= set(active)
    return types - set(exclude or ())


def fresh_tab_groups(page: str) -> str:
    """The HTML with new radio-group names for its tabs: a result shown twice on one page (its cell's
    output, then ``r`` in another) must not share a group, or a click in one would switch the other."""
    renamed: dict[str, str] = {}

    def renamed_group(match: re.Match) -> str:
        if match.group() not in renamed:
            renamed[match.group()] = _tab_group()
        return renamed[match.group()]
    return _TAB_GROUP.sub(renamed_group, page)


def _tab_group() -> str:
    return f"tm-tabs-{uuid.uuid4().hex[:12]}"


def report_html(body: str) -> str:
    """HTML made self-contained: the stylesheet, then the body in the report's frame."""
    return f'{CSS}<div class="tm-report">{body}</div>'


def png_img(png: bytes | None, alt: str) -> str:
    """A PNG inlined as a data URI (no file, no server), or nothing."""
    if not png:
        return ""
    return (f'<img alt="{html.escape(alt)}" style="max-width:100%" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode()}"/>')


def tabs_html(pages: list[tuple[str, str | bytes]]) -> str:
    """Pages as tabs made of HTML and CSS only (a radio button per page), so they switch in a saved
    notebook with no kernel.  Each page is an HTML body or a picture (PNG bytes).  Where a frontend
    strips styles or inputs (GitHub, a sanitised untrusted output), every page shows, under its title:
    a page is hidden only by a rule that needs its unchecked button."""
    if len(pages) == 1:
        title, page = pages[0]
        return png_img(page, title) if isinstance(page, bytes) else page
    group = _tab_group()  # one radio group per report: two reports never share one
    parts = []
    for i, (title, page) in enumerate(pages):
        tab = f"{group}-{i}"
        body = png_img(page, title) if isinstance(page, bytes) else page
        parts.append(f'<input type="radio" name="{group}" id="{tab}"{" checked" if i == 0 else ""}>'
                     f'<label for="{tab}">{html.escape(title)}</label><div class="tm-page">{body}</div>')
    return f'<div class="tm-tabs">{"".join(parts)}</div>'


# A saved output whose widget's model is gone (the notebook reopened after the kernel ended) shows
# "Error displaying widget: model not found" in JupyterLab and Notebook 7: the output element itself
# then has class jupyter-widgets (a live view has it on an element inside).  The report before the
# controls hides that one output when so.
_DEAD_CONTROLS_CSS = ("<style>.jp-OutputArea-child:has(.{key})+.jp-OutputArea-child"
                      ":has(.jp-OutputArea-output.jupyter-widgets){{display:none}}</style>"
                      "<span class=\"{key}\"></span>")


def _display_with_controls(result: Result) -> None:
    """The report, then its controls (a widget, with an empty text fallback for frontends without
    widgets), then an output that what the controls run fills with HTML that lasts."""
    from IPython.display import display

    bundle = result._repr_mimebundle_()
    below: list = []  # the display handle of the output under the controls, once shown
    try:
        controls = _shown_widget(result, lambda shown: below[-1].update(shown, raw=True))
    except Exception:  # a broken control must never hide the report
        controls = None
    if controls is None:
        display(bundle, raw=True)
        return
    bundle["text/html"] += _DEAD_CONTROLS_CSS.format(key=f"tm-live-{uuid.uuid4().hex[:12]}")
    display(bundle, raw=True)
    display({WIDGET_MIME: controls._repr_mimebundle_()[WIDGET_MIME], "text/plain": ""}, raw=True)
    below.append(display({"text/plain": ""}, raw=True, display_id=True))


def captured_bundle(captured, error: BaseException | None = None) -> dict:
    """What a command printed and displayed (IPython's ``capture_output``), and its error, as one
    text and HTML bundle: the HTML of each display where it has one."""
    texts, pages = [], []

    def printed(text: str, css: str = "") -> None:
        text = visible(text, keep=VIEW_WHITESPACE)  # what ran printed it; this report shows it, escapes written out
        if text:
            texts.append(text.rstrip("\n"))
            pages.append(f'<pre class="{css}">{html.escape(text)}</pre>')

    printed(captured.stdout)
    for output in captured.outputs:
        data = output.data
        if data.get("text/html"):
            texts.append(data.get("text/plain", ""))
            pages.append(data["text/html"])
        else:
            printed(data.get("text/plain", ""))
    printed(captured.stderr, "tm-note")
    if error is not None:
        printed(f"{type(error).__name__}: {error}", "tm-note")
    return {"text/plain": "\n".join(t for t in texts if t), "text/html": "".join(pages)}


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


# A result's controls live as long as the result, and a result shown while a cell ran lives until
# that cell runs again.  ipywidgets keeps every widget until it is closed.
# JupyterLab clears a cell's outputs when it runs it again, so its old views are gone by then;
# closing a widget still on screen would blank it, so a display outside any known cell (no cell id:
# a button's callback, a frontend that sends none) keeps its result for the session, as before.
_widgets: dict[int, Any] = {}          # id(result) -> its controls, until the result is collected
_below: dict[int, Callable[[dict], None]] = {}  # id(result) -> shows a bundle under its latest display
_shown_in_cell: dict[str, list] = {}   # cell id -> the results shown while it last ran
_shown_elsewhere: list = []
_shells_watched: set[int] = set()


def _shown_widget(result: Result, show_below: Callable[[dict], None]):
    """The result's controls (or None), built on their first display and kept for the next ones:
    what they run shows under the latest display."""
    key = id(result)
    widget = _widgets.get(key)
    if widget is None:
        widget = result.controls(lambda shown: _below[key](shown))
        if widget is None:
            return None
        try:
            weakref.finalize(result, _close_widget, key)
        except TypeError:  # a result that takes no weak reference: its controls run where first shown
            _shown_elsewhere.append(widget)
            _below[key] = show_below
            return widget
        _widgets[key] = widget
    _below[key] = show_below
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

    _below.pop(key, None)
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
