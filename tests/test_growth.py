"""Memory that grows with every run (issue 30).  A report's widget view: ipywidgets keeps every
widget until it is closed, so each display of an analyze report kept its HTML and picture for good
(+9 MiB over 50 displays in a kernel).  Now a result's widget lives as long as the result, and a
result shown while a cell ran lives until that cell runs again (JupyterLab clears its outputs then).
The figures over 50 runs of every magic are benchmarks/growth.py's."""

import gc
from pathlib import Path

import pytest

from torchmagic.core.render import base

TRACE = Path(__file__).parent / "data" / "traces" / "hta_cpu_gloo_rank-34.json.gz"


@pytest.fixture
def widgets(monkeypatch):
    ipywidgets = pytest.importorskip("ipywidgets")
    monkeypatch.setattr(base, "widget_frontend", lambda: True)  # as in a JupyterLab kernel
    from ipywidgets.widgets import widget

    return lambda: len(widget._instances)


def test_a_cell_run_again_closes_the_widgets_its_last_run_showed(shell, widgets):
    code = f"import torchmagic\ndisplay(torchmagic.analyze({str(TRACE)!r}))"
    shell.run_cell(code, cell_id="report-cell")
    gc.collect()
    after_one = widgets()
    for _ in range(4):
        shell.run_cell(code, cell_id="report-cell")
    gc.collect()
    assert widgets() == after_one  # the earlier runs' views were cleared, and their widgets closed


def test_a_result_kept_or_shown_twice_keeps_one_widget(shell, widgets):
    shell.run_cell(f"import torchmagic\nkept = torchmagic.analyze({str(TRACE)!r})\ndisplay(kept)", cell_id="a")
    gc.collect()
    before = widgets()
    shell.run_cell("display(kept); display(kept)", cell_id="b")  # one model, three views
    assert widgets() == before
    shell.run_cell("pass", cell_id="a")  # the cell that showed it runs again: the variable still holds it
    gc.collect()
    assert widgets() == before
    shell.run_cell("del kept", cell_id="b")
    shell.run_cell("pass", cell_id="b")
    gc.collect()
    assert widgets() < before  # nothing shows or holds it any more
