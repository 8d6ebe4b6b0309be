"""Every magic's widget view, rendered by JupyterLab in a real (headless) Chromium.

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
from .lab import chromium_page, find_chromium, jupyterlab

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


def _run_all(page) -> None:
    """Run > Run All Cells, retried until the first cell is queued (the menu can race the kernel's start)."""
    for _ in range(5):
        page.click(".lm-MenuBar-itemLabel:text-is('Run')")
        page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
        try:
            page.wait_for_function(
                "() => !document.querySelector('.jp-CodeCell .jp-InputPrompt').textContent.includes('[ ]')",
                timeout=10_000)
            return
        except Exception:
            page.keyboard.press("Escape")
    raise AssertionError("JupyterLab never started running the notebook")


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


def test_each_magic_renders_its_widget_in_jupyterlab(tmp_path):
    chromium = _browser_or_skip()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    notebook = write_notebook(tmp_path / "magics.ipynb", {**MAGICS, **LONG_PROFILE})

    with jupyterlab(tmp_path) as (base, token), chromium_page(chromium) as (page, errors):
        page.goto(f"{base}/lab/tree/{notebook.name}?token={token}")
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        _run_all(page)

        for name, spec in {**MAGICS, **LONG_PROFILE}.items():
            cell = _cell(page, name)
            _wait_done(cell, lambda: _diagnosis(page, tmp_path, errors))
            shown = "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())
            assert "Traceback" not in shown, f"{name} raised:\n{shown}"
            view = cell.locator(".jupyter-widgets.widget-tab" if spec["tabs"] else ".widget-html")
            view.first.wait_for(timeout=30_000)
            assert view.count() == 1, f"{name}: {view.count()} widget views"
            if spec["tabs"]:
                titles = [t.strip() for t in view.locator(".lm-TabBar-tabLabel").all_inner_texts()]
                assert titles == spec["tabs"], f"{name}: tabs {titles}"
            assert spec["text"] in view.inner_text()
            cell.scroll_into_view_if_needed()
            cell.screenshot(path=str(ARTIFACTS / f"{name}.png"))
            rows, plots = view.locator(".tm-table tbody tr:visible").count(), 0
            for title in (spec["tabs"] or [])[1:]:
                view.locator(f".lm-TabBar-tab:has-text('{title}')").click()
                pane = view.locator(".widget-tab-contents > :visible").first
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

        page.click(".lm-MenuBar-itemLabel:text-is('File')")
        page.click(".lm-Menu-itemLabel:text-is('Save Notebook')")
        page.wait_for_selector(".jp-mod-dirty", state="detached", timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "notebook.png"), full_page=True)
        assert errors == [], "the browser logged errors:\n" + "\n".join(errors)

    saved = nbformat.read(notebook, as_version=4)
    assert all(o.output_type != "error" for c in saved.cells for o in c.get("outputs", []))
    assert notebook.stat().st_size < MAX_NOTEBOOK_BYTES, f"saved notebook is {notebook.stat().st_size:,} bytes"
