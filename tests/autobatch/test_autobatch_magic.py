"""%autobatch in a real IPython InteractiveShell."""

import pytest
import torch

from torchmagic.features.autobatch.magic import parse_budget
from torchmagic.features.autobatch.result import AutobatchResult

from ..conftest import run

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
def step(bs):
    loss = model(torch.randn(bs, 64)).logsumexp(1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.slow
def test_named_step_returns_result_and_restores_the_model(shell):
    shell.run_cell(SETUP)
    before = shell.user_ns["model"][0].weight.detach().clone()
    result, captured = run(shell, "r = %autobatch --budget 8MiB --multiple-of 8 step")
    assert result.success, result.error_in_exec
    assert captured.outputs == []  # an assignment shows nothing
    r = shell.user_ns["r"]
    assert isinstance(r, AutobatchResult) and r.batch_size and r.batch_size % 8 == 0
    assert r.answer_trial.peak_bytes <= r.limit_bytes
    assert torch.equal(shell.user_ns["model"][0].weight, before)
    assert shell.user_ns["opt"].state_dict()["state"] == {}
    result, captured = run(shell, "%autobatch --budget 8MiB --multiple-of 8 step")
    assert isinstance(result.result, AutobatchResult)  # the cell's value: shown once, as Out[n]
    assert captured.outputs == [] and captured.stdout.count("Largest batch size that fits") == 1
    result, captured = run(shell, "%autobatch -q --budget 8MiB step")
    assert result.result is None and captured.outputs == [] and captured.stdout == ""


def test_expression_with_bs_placeholder(shell):
    shell.run_cell(SETUP)
    shell.user_ns["BS"] = "mine"
    result, _ = run(shell, "%autobatch -q -o r --budget 4MiB -- model(torch.randn(BS, 64)).sum().backward()")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert r.batch_size and r.label.startswith("model(torch.randn(BS")
    assert shell.user_ns["BS"] == "mine"  # the user's own BS is put back
    assert all(p.grad is None for p in shell.user_ns["model"].parameters())


@pytest.mark.parametrize("line, message", [
    ("", "name a step callable"),
    ("nothing_here", "'nothing_here' is not defined"),
    ("model_name", "is not callable"),
    ("--budget lots step", "--budget takes bytes"),
    ("--budget -1 step", "--budget"),
    ("--margin 1.5 step", "margin must be in [0, 1)"),
    ("--min 10 --max 2 step", "below min"),
    ("--multiple-of 0 step", "at least 1"),
    ("-- model(torch.randn(4, 64))", "must use BS"),
    ("step -- model(BS)", "not both"),
    ("--wat step", "unrecognized arguments"),
])
def test_bad_input_is_a_one_line_usage_error(shell, line, message):
    shell.run_cell(SETUP)
    shell.user_ns["model_name"] = "not callable"
    result, captured = run(shell, f"%autobatch {line}")
    out = captured.stdout + captured.stderr
    assert message in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1


def test_user_error_in_step_shows_the_users_traceback(shell):
    shell.run_cell("def broken(bs):\n    raise KeyError('no such column')")
    result, captured = run(shell, "%autobatch --budget 1MiB broken")
    assert isinstance(result.error_in_exec, KeyError)
    assert "no such column" in captured.stdout and "engines/autobatch" not in captured.stdout


@pytest.mark.parametrize("text, value", [("8GiB", 8 * 2**30), ("512MiB", 512 * 2**20), ("2e9", 2e9),
                                         ("0.9", 0.9), ("1.5 GB", 1.5e9), ("100mb", 1e8)])
def test_parse_budget(text, value):
    assert parse_budget(text) == pytest.approx(value)


def test_progress_line_in_notebooks(shell, monkeypatch):
    import torchmagic.core.ipython

    monkeypatch.setattr(torchmagic.core.ipython, "widget_frontend", lambda: True)
    shell.run_cell(SETUP)
    result, captured = run(shell, "r = %autobatch --budget 4MiB step")
    texts = [o.data.get("text/plain", "") for o in captured.outputs]
    assert texts[0] == "%autobatch: starting…"
    assert any(t.startswith("%autobatch: run 1: batch 1 → peak") for t in texts)
    assert texts[-1] == ""  # cleared at the end


def test_no_estimate_flag(shell):
    shell.run_cell(SETUP)
    result, _ = run(shell, "r = %autobatch --no-estimate --budget 4MiB step")
    assert result.success and not any(t.estimated for t in shell.user_ns["r"].trials)


def test_the_magic_and_the_api_restore_the_same_objects(shell, monkeypatch):
    """Both restore what the step reaches (here through a helper), not every model in the notebook."""
    import torchmagic.api
    import torchmagic.features.autobatch.magic as magic

    shell.run_cell(SETUP + "unrelated = nn.Linear(4, 4)\ndef outer(bs):\n    step(bs)\n")
    chosen = []

    def spy(step, options, *, state, **kwargs):
        chosen.append(state)
        raise KeyboardInterrupt  # stop before any probing: only the choice is under test

    monkeypatch.setattr(magic, "run_autobatch", spy)
    monkeypatch.setattr(torchmagic.api, "run_autobatch", spy)
    run(shell, "%autobatch outer")
    with pytest.raises(KeyboardInterrupt):
        torchmagic.api.autobatch(shell.user_ns["outer"])
    model, opt = shell.user_ns["model"], shell.user_ns["opt"]
    assert [[id(o) for o in state] for state in chosen] == [[id(model), id(opt)]] * 2
