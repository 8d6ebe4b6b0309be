"""Memory that grows with every run (issue 30).  ipywidgets keeps every widget until it is closed:
each display of a report once kept its widget view for good (+9 MiB over 50 displays of an analyze
report in a kernel).  Reports are HTML now; the live controls below a profile (its verify buttons)
live as long as the result, and a result shown while a cell ran lives until that cell runs again
(JupyterLab clears its outputs then).
The figures over 50 runs of every magic are benchmarks/growth.py's."""

import dataclasses
import gc

import pytest

from torchmagic.core.render import base, live

from .profile.test_render import make_result


@pytest.fixture
def widgets(monkeypatch):
    ipywidgets = pytest.importorskip("ipywidgets")
    monkeypatch.setattr(base, "widget_frontend", lambda: True)  # as in a JupyterLab kernel
    from ipywidgets.widgets import widget

    return lambda: len(widget._instances)


def _profile_with_a_verify():
    """A profile (built from numbers) whose finding has a verify command: its live view has buttons."""
    r = make_result()
    r.findings[0] = dataclasses.replace(r.findings[0], verify="%loadertune train_loader")
    live.set_runner(r, lambda result, command: None)
    return r


def test_a_cell_run_again_closes_the_controls_its_last_run_showed(shell, widgets):
    shell.user_ns["profile_with_a_verify"] = _profile_with_a_verify
    code = "display(profile_with_a_verify())"
    before = widgets()
    shell.run_cell(code, cell_id="report-cell")
    gc.collect()
    after_one = widgets()
    assert after_one > before  # the verify buttons
    for _ in range(4):
        shell.run_cell(code, cell_id="report-cell")
    gc.collect()
    assert widgets() == after_one  # the earlier runs' views were cleared, and their widgets closed


def test_a_result_kept_or_shown_twice_keeps_one_set_of_controls(shell, widgets):
    shell.user_ns["profile_with_a_verify"] = _profile_with_a_verify
    shell.run_cell("kept = profile_with_a_verify()\ndisplay(kept)", cell_id="a")
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


def test_reports_without_controls_make_no_widget(shell, widgets):
    """A %gpumem report of many variables once built a widget holding its HTML, and the next call paid
    for freeing it (489 ms against 17 ms after 30,000 variables): reports are HTML, nothing to free."""
    shell.run_cell("import torch\nfor i in range(2000): globals()[f'v{i}'] = torch.zeros(4)")
    before = widgets()
    for _ in range(3):
        shell.run_cell("%gpumem -o r", cell_id="g")
    assert widgets() == before
    shell.run_cell("for i in range(2000): del globals()[f'v{i}']\ndel r")
