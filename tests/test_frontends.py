"""The results where widgets cannot show: a notebook executed headless and exported by nbconvert
(the HTML view), terminal IPython (the text view), and the size of what a notebook saves."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from .frontend_notebook import LONG_PROFILE, MAGICS, magic_marker, write_notebook

pytestmark = pytest.mark.slow

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
MAX_NOTEBOOK_BYTES = 2 * 2**20


def execute(path: Path) -> nbformat.NotebookNode:
    """Run the notebook the way `jupyter nbconvert --execute` does (nbclient, a fresh kernel) and save it."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return nb


def magic_outputs(nb, name: str) -> list[dict]:
    cell = next(c for c in nb.cells if magic_marker(name) in c.source)
    return [o for o in cell.outputs if o.output_type in ("display_data", "execute_result")]


class _Headlines(HTMLParser):
    """The text of every element with class tm-headline, and whether any widget view is embedded."""

    def __init__(self):
        super().__init__()
        self.headlines: list[str] = []
        self.widget_views = 0
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("type") == WIDGET_MIME:
            self.widget_views += 1
        if self._depth:
            self._depth += 1
        elif "tm-headline" in (attrs.get("class") or "").split():
            self._depth = 1
            self.headlines.append("")

    def handle_endtag(self, tag):
        if self._depth:
            self._depth -= 1

    def handle_data(self, data):
        if self._depth:
            self.headlines[-1] += data


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    path = write_notebook(tmp_path_factory.mktemp("nbconvert") / "magics.ipynb", {**MAGICS, **LONG_PROFILE})
    return path, execute(path)


def test_headless_execution_saves_html_views_and_nbconvert_shows_them(executed):
    from nbconvert import HTMLExporter

    path, nb = executed
    for name, spec in MAGICS.items():
        outputs = magic_outputs(nb, name)
        shown = [o for o in outputs if "tm-report" in o.data.get("text/html", "")]
        assert len(shown) == 1, f"{name}: {[list(o.data) for o in outputs]}"
        assert WIDGET_MIME not in shown[0].data, f"{name}: a widget view nobody can render was saved"
        assert spec["text"] in shown[0].data["text/plain"]
    assert "widgets" not in nb.metadata  # no widget state: nothing for a static page to lose

    body, _ = HTMLExporter().from_notebook_node(nb)
    page = _Headlines()
    page.feed(body)
    assert page.widget_views == 0
    assert len(page.headlines) == len(MAGICS) + len(LONG_PROFILE)
    assert any("amp" in h and "eager" in h for h in page.headlines)
    assert any(h.startswith("Largest batch size that fits") for h in page.headlines)


def test_profiling_a_long_loop_keeps_the_notebook_small(executed):
    path, nb = executed
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES
    (out,) = [o for o in magic_outputs(nb, "long_profile") if "tm-report" in o.data.get("text/html", "")]
    assert len(json.dumps(out)) < 200_000  # 9,000 profiled steps' worth of ops, summarised


TERMINAL_SESSION = textwrap.dedent("""\
    import sys
    from IPython.terminal.ipapp import TerminalIPythonApp

    app = TerminalIPythonApp.instance()
    app.initialize(["--no-banner", "--colors=NoColor", "--HistoryManager.hist_file=:memory:"])
    cells = {cells!r}
    for cell in cells:
        print("=== cell", flush=True)
        result = app.shell.run_cell(cell, store_history=True)
        if not result.success:
            sys.exit(f"cell failed: {{result.error_in_exec or result.error_before_exec!r}}")
""")


def test_terminal_ipython_prints_the_text_views(tmp_path):
    """Each input run as terminal IPython runs it (TerminalInteractiveShell, its display hook and formatter)."""
    nb = nbformat.read(write_notebook(tmp_path / "magics.ipynb"), as_version=4)
    cells = [c.source for c in nb.cells]
    proc = subprocess.run([sys.executable, "-c", TERMINAL_SESSION.format(cells=cells)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    printed = proc.stdout.split("=== cell\n")[1:]
    assert len(printed) == len(cells)
    for (name, spec), text in zip(MAGICS.items(), printed[2:]):
        assert spec["text"] in text, f"{name} printed:\n{text}"
        for leak in ("<div", "<style", "<table", "Tab(children", "HTML(value", "model_id"):
            assert leak not in text, f"{name} printed markup or a widget repr:\n{text}"
    assert "Traceback" not in proc.stdout + proc.stderr


def test_nbconverts_page_shows_code_in_a_monospaced_font(executed, tmp_path):
    """Issue 51: a finding's fix snippet showed in a proportional font on nbconvert's HTML page (its stylesheet
    gives every pre the page's font): the report names a code font for its code."""
    from nbconvert import HTMLExporter

    from .lab import chromium_page
    from .test_browser import _browser_or_skip

    chromium = _browser_or_skip()
    _, nb = executed
    page_file = tmp_path / "magics.html"
    page_file.write_text(HTMLExporter().from_notebook_node(nb)[0])
    with chromium_page(chromium) as (page, _errors):
        page.goto(page_file.as_uri())
        fonts = page.evaluate("() => [...document.querySelectorAll('.tm-report pre, .tm-report code')]"
                              ".map(e => getComputedStyle(e).fontFamily)")
    assert fonts and all(font.endswith("monospace") for font in fonts), fonts
