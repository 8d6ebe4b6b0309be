"""Every magic's report, rendered by JupyterLab in a real (headless) Chromium, live and reopened.

Skipped only where no Chromium or Playwright is found, and never under CI (`CI` set): there it fails,
so the check cannot silently go missing.  Screenshots land in test-artifacts/browser/ (or
$TORCHMAGIC_ARTIFACTS/browser/).
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from pathlib import Path

import nbformat
import pytest

from .frontend_notebook import LONG_PROFILE, MAGICS, magic_marker, write_notebook
from .lab import chromium_page, find_chromium, jupyterlab, notebook_kernels, start_notebook_kernel

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

pytestmark = pytest.mark.slow

ARTIFACTS = Path(os.environ.get("TORCHMAGIC_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts")) / "browser"
MAX_NOTEBOOK_BYTES = 2 * 2**20
CELL_TIMEOUT_MS = 180_000


def _browser_or_skip() -> str:
    missing = []
    chromium = find_chromium()
    if chromium is None:
        missing.append("no Chromium on PATH (apt install chromium)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("no playwright module (pip install playwright)")
    if missing:
        reason = "no browser test: " + "; ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(f"{reason}, and CI must run it")
        pytest.skip(reason)
    return chromium


_STARTED = "() => !document.querySelector('.jp-CodeCell .jp-InputPrompt').textContent.includes('[ ]')"


def _run_all(page) -> None:
    """Run > Run All Cells, retried until the first cell is queued (the menu can race the kernel's start,
    and on a loaded machine a dialog JupyterLab opens meanwhile can cover the menu: it is closed, and said).
    A retry first looks whether the last click took after all (a slow browser showed it late): clicking
    again would run every cell twice."""
    dialogs = []
    for attempt in range(5):
        try:
            _close_dialogs(page, dialogs)
            if attempt and page.evaluate(_STARTED):
                break
            page.click(".lm-MenuBar-itemLabel:text-is('Run')", timeout=10_000)
            page.click(".lm-Menu-itemLabel:text-is('Run All Cells')", timeout=10_000)
            page.wait_for_function(_STARTED, timeout=20_000)
            break
        except Exception:
            page.keyboard.press("Escape")
    else:
        raise AssertionError("JupyterLab never started running the notebook; dialogs it showed: " + repr(dialogs))
    if dialogs:
        print("closed JupyterLab dialogs before running:", *dialogs, sep="\n")


def _close_dialogs(page, seen: list[str]) -> None:
    """Dismissed, never accepted: the notebook's kernel is already running (start_notebook_kernel), and
    accepting "Select Kernel" would replace it."""
    dialog = page.locator(".jp-Dialog")
    while dialog.count():
        seen.append(dialog.first.inner_text().strip())
        page.keyboard.press("Escape")
        dialog.first.wait_for(state="detached", timeout=15_000)


def _cell(page, name: str):
    return page.locator(f".jp-CodeCell:has(.jp-InputArea:has-text('{magic_marker(name)}'))")


def _wait_done(cell, diagnose) -> None:
    """Until the cell's prompt shows an execution count ([*] while it runs, [ ] if never run)."""
    prompt = cell.locator(".jp-InputPrompt")
    deadline = time.monotonic() + CELL_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        text = prompt.inner_text()
        if any(ch.isdigit() for ch in text):
            return
        time.sleep(0.25)
    raise AssertionError(f"cell not done after {CELL_TIMEOUT_MS / 1000:.0f} s: {prompt.inner_text()!r}\n{diagnose()}")


def _diagnosis(page, root: Path, errors: list[str]) -> str:
    """What a failed run leaves to go on: every cell's prompt and output, the kernel's and the
    server's log lines (a dead kernel shows there), the browser's errors."""
    cells = page.locator(".jp-CodeCell")
    lines = ["cells:"]
    for i in range(cells.count()):
        cell = cells.nth(i)
        prompt = cell.locator(".jp-InputPrompt").inner_text().strip()
        output = " | ".join(cell.locator(".jp-OutputArea-output").all_inner_texts())
        lines.append(f"  {i}: {prompt} {output[:400]!r}")
    log = (root / "jupyterlab.log").read_text(errors="replace").splitlines()
    lines += ["jupyterlab.log (last 40 lines):", *("  " + line for line in log[-40:])]
    lines += ["browser errors:", *("  " + e for e in errors)]
    return "\n".join(lines)


def _image_drawn(pane) -> bool | None:
    """Whether the pane's picture (the pane itself or an <img> in it) has loaded; None without one."""
    return pane.evaluate("""el => {
        const img = el.tagName === 'IMG' ? el : el.querySelector('img');
        return img ? img.complete && img.naturalWidth > 0 : null;
    }""")


def _check_tabs(name: str, spec: dict, report, cell) -> None:
    """The report's tabs (HTML and CSS only) switch, and their pages hold tables and plots."""
    titles = [t.strip() for t in report.locator(":scope > .tm-tabs > label").all_inner_texts()]
    assert titles == (spec["tabs"] or []), f"{name}: tabs {titles}"
    rows, plots = report.locator(".tm-table tbody tr:visible").count(), 0
    for title in (spec["tabs"] or [])[1:]:
        report.locator(f":scope > .tm-tabs > label:text-is('{title}')").click()
        pane = report.locator(":scope > .tm-tabs > .tm-page:visible")
        assert pane.count() == 1, f"{name}/{title}: {pane.count()} pages shown"
        drawn = _image_drawn(pane)
        if drawn is None:
            assert pane.inner_text().strip(), f"{name}/{title}: an empty tab"
            rows += pane.locator(".tm-table tbody tr").count()
        else:
            assert drawn, f"{name}/{title}: the plot did not load"
            plots += 1
        cell.screenshot(path=str(ARTIFACTS / f"{name}-{re.sub(r'[^a-z]+', '_', title.lower())}.png"))
    assert rows >= 1, f"{name}: no table rows"
    if spec["tabs"]:
        assert plots >= 1, f"{name}: no plot in any tab"
        report.locator(f":scope > .tm-tabs > label:text-is('{spec['tabs'][0]}')").click()


def _run_verify_button(cell, diagnose) -> str:
    """Clicks the report's first verify button; the text of the report it puts below the buttons,
    once it is the verify's report (a "Running ..." note shows there first, and a save before the
    report replaced it would leave the notebook changed)."""
    button = cell.locator(".widget-button").first
    try:
        button.wait_for(timeout=60_000)
    except Exception as exc:
        outputs = "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())
        raise AssertionError(f"no verify button ({exc.__class__.__name__}); the cell shows:\n{outputs}\n{diagnose()}")
    button.click()
    below = cell.locator(".jp-OutputArea-output:has(.tm-report)").nth(1)
    below.locator(".tm-headline").first.wait_for(timeout=CELL_TIMEOUT_MS)
    return below.inner_text()


def test_each_magic_renders_its_report_and_a_reopened_notebook_still_shows_it(tmp_path):
    """Live: each report with working tabs, a verify button whose run reports below it.  Saved,
    closed with its kernel shut down and reopened: every report, the verify's included, still shows,
    and no widget error does."""
    chromium = _browser_or_skip()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    notebook = write_notebook(tmp_path / "magics.ipynb", {**MAGICS, **LONG_PROFILE})
    url = None
    headlines = {}

    with jupyterlab(tmp_path) as (base, token), chromium_page(chromium) as (page, errors):
        kernel = start_notebook_kernel(base, token, notebook.name)
        url = f"{base}/lab/tree/{notebook.name}?token={token}"
        page.goto(url)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        _run_all(page)

        def diagnose():
            return f"kernels: started {kernel}, now {notebook_kernels(base, token)}\n" + _diagnosis(page, tmp_path, errors)

        for name, spec in {**MAGICS, **LONG_PROFILE}.items():
            cell = _cell(page, name)
            _wait_done(cell, diagnose)
            shown = "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())
            assert "Traceback" not in shown, f"{name} raised:\n{shown}"
            reports = cell.locator(".tm-report")
            assert reports.count() == 1, f"{name}: {reports.count()} reports"
            assert spec["text"] in reports.inner_text()
            headlines[name] = reports.locator(".tm-headline").first.inner_text().strip()
            cell.scroll_into_view_if_needed()
            cell.screenshot(path=str(ARTIFACTS / f"{name}.png"))
            _check_tabs(name, spec, reports.first, cell)
        verified = _run_verify_button(_cell(page, "torchprofile"), diagnose)
        assert "%%torchprofile" in verified and "Traceback" not in verified, verified

        page.click(".lm-MenuBar-itemLabel:text-is('File')")
        page.click(".lm-Menu-itemLabel:text-is('Save Notebook')")
        page.wait_for_selector(".jp-mod-dirty", state="detached", timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "notebook.png"), full_page=True)
        assert errors == [], "the browser logged errors:\n" + "\n".join(errors)
        assert notebook_kernels(base, token) == [kernel], "JupyterLab replaced the notebook's kernel"
        page.click(".lm-MenuBar-itemLabel:text-is('Kernel')")
        page.click(".lm-Menu-itemLabel:text-is('Shut Down Kernel')")
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", state="detached",
                               timeout=30_000)

    saved = nbformat.read(notebook, as_version=4)
    assert all(o.output_type != "error" for c in saved.cells for o in c.get("outputs", []))
    assert notebook.stat().st_size < MAX_NOTEBOOK_BYTES, f"saved notebook is {notebook.stat().st_size:,} bytes"
    reports = [o for c in saved.cells for o in c.get("outputs", [])
               if "tm-report" in o.get("data", {}).get("text/html", "")]
    assert reports and not [o for o in reports if WIDGET_MIME in o.data], "a report saved as a widget"

    # the next morning: a new server, the notebook reopened (a fresh kernel, none of the widgets' models)
    with jupyterlab(tmp_path) as (base, token), chromium_page(chromium) as (page, errors):
        page.goto(f"{base}/lab/tree/{notebook.name}?token={token}")
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        page.wait_for_timeout(3_000)  # the widget manager restores (and fails to find) the old models
        page.screenshot(path=str(ARTIFACTS / "reopened.png"), full_page=True)
        for name, spec in {**MAGICS, **LONG_PROFILE}.items():
            cell = _cell(page, name)
            headline = cell.locator(".tm-report .tm-headline").first
            headline.wait_for(timeout=30_000)
            assert headline.inner_text().strip() == headlines[name], (name, headline.inner_text(), headlines[name])
            if spec["tabs"]:
                _check_tabs(name, spec, cell.locator(".tm-report").first, cell)
        assert "%%torchprofile" in _cell(page, "torchprofile").locator(".tm-report").nth(1).inner_text()
        dead = page.locator("text=Error displaying widget")
        assert not [i for i in range(dead.count()) if dead.nth(i).is_visible()], "a widget error shows"
        assert not [e for e in errors if "model not found" not in e], "\n".join(errors)
