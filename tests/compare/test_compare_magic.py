"""%%amp_compare in a real IPython InteractiveShell (no torch.compile here: see test_compare_compile)."""

import pytest
import torch

from torchmagic.core.settings import TorchSettings
from torchmagic.features.compare.magic import CompareMagics
from torchmagic.features.compare.result import CompareResult

from ..conftest import run
from ..fakes import FastBf16Cpu

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
criterion = nn.MSELoss()
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(16, 32), torch.randn(16, 4)
original = net
w0 = net[0].weight.detach().clone()
"""

TRAIN = """opt.zero_grad()
out = net(x)
loss = criterion(out, y)
loss.backward()
opt.step()
loss.item()"""


def test_training_cell_returns_eagers_value_and_leaves_everything_as_it_was(shell):
    shell.run_cell(SETUP)
    settings = TorchSettings.capture()
    result, captured = run(shell, "%%amp_compare --variants eager,amp --runs 4 --warmup 1 -o r\n" + TRAIN)
    assert result.success, result.error_in_exec
    ns = shell.user_ns
    r = ns["r"]
    assert isinstance(r, CompareResult) and r.best.name in ("eager", "amp") and r["amp"].ok
    # the value and the variables are those of eager's first run, from the original weights
    first_loss = torch.nn.functional.mse_loss(ns["original"](ns["x"]), ns["y"]).item()
    assert result.result == pytest.approx(first_loss, rel=1e-6) and ns["loss"].item() == result.result
    assert ns["out"].dtype == torch.float32  # not the amp run's bf16 output
    assert ns["net"] is ns["original"] and torch.equal(ns["net"][0].weight, ns["w0"])
    assert ns["opt"].state_dict()["state"] == {}  # momentum buffers the runs created are gone
    assert TorchSettings.capture() == settings
    shown = [o.data["text/plain"] for o in captured.outputs]
    assert any(r.headline() in text for text in shown)


def test_q_shows_nothing_and_the_default_model_is_the_one_with_parameters(shell):
    shell.run_cell(SETUP)
    result, captured = run(shell, "%%amp_compare -q -o r --runs 2 --warmup 0 --variants eager,int8\n"
                                  "with torch.no_grad():\n    pred = net(x)\ncriterion(pred, y);")
    assert result.success and captured.outputs == [] and captured.stdout == ""
    assert shell.user_ns["r"]["int8"].ok  # int8 needed the model: net was found, not criterion


OLD_FLAG_NOTE = "--output is now --accuracy-of (it will be removed)"


def test_accuracy_of_picks_the_compared_variable(shell):
    shell.run_cell(SETUP)
    result, _ = run(shell, "%%amp_compare -q -o r --runs 2 --warmup 0 --variants eager,amp --accuracy-of pred\n"
                           "pred = net(x)\n'not compared'")
    assert result.success and result.result == "not compared"
    r = shell.user_ns["r"]
    assert r["amp"].max_rel_err > 0 and OLD_FLAG_NOTE not in r.notes


def test_output_still_works_as_accuracy_of_with_a_note_in_the_report(shell):
    shell.run_cell(SETUP)
    result, captured = run(shell, "%%amp_compare -o r --runs 2 --warmup 0 --variants eager,amp --output pred\n"
                                  "pred = net(x)\n'not compared'")
    assert result.success and result.result == "not compared"
    r = shell.user_ns["r"]
    assert r["amp"].max_rel_err > 0 and r.notes[0] == OLD_FLAG_NOTE
    assert captured.outputs[0].data["text/plain"].splitlines().count(OLD_FLAG_NOTE) == 1  # one line, shown
    assert OLD_FLAG_NOTE in captured.outputs[0].data["text/html"]
    assert "Traceback" not in captured.stdout + captured.stderr


def test_output_and_accuracy_of_together_are_a_usage_error(shell):
    shell.run_cell(SETUP + "ran = False")
    result, captured = run(shell, "%%amp_compare --output pred --accuracy-of pred\nran = True\npred = net(x)")
    text = (captured.stderr + captured.stdout).strip()
    assert not shell.user_ns["ran"] and "Traceback" not in text
    assert text == "UsageError: %%amp_compare: --output is now --accuracy-of; give only --accuracy-of"


def test_several_models_need_a_choice(shell):
    shell.run_cell(SETUP + "teacher = nn.Linear(32, 4)")
    result, captured = run(shell, "%%amp_compare\nnet(x) + teacher(x)")
    text = captured.stderr + captured.stdout
    assert "several models (net, teacher)" in text and "--model NAME" in text
    result, _ = run(shell, "%%amp_compare --model teacher -q --runs 2 --warmup 0 --variants eager,int8 -o r\n"
                           "with torch.no_grad():\n    net(x) + teacher(x)")
    assert result.success and shell.user_ns["r"]["int8"].ok


@pytest.mark.parametrize("line, message", [
    ("--runs two", "invalid int value"),
    ("--runs 1", "at least 2 rounds"),
    ("--min-time 0", "must be positive"),
    ("--warmup -2", "cannot be negative"),
    ("--variants eager,turbo", "unknown variant part 'turbo'"),
    ("--variants amp,amp", "listed twice"),
    ("--dtype int4", "bf16 or fp16"),
    ("--rtol -1", "non-negative"),
    ("--model missing", "'missing' is not defined"),
    ("--model x", "is a Tensor, not an nn.Module"),
    ("-o 9lives", "-o needs a Python variable name"),
    ("--accuracy-of 2x", "%%amp_compare: --accuracy-of needs a variable name"),
    ("--output 2x", "--accuracy-of needs a variable name"),
    ("--bogus", "unrecognized arguments"),
])
def test_bad_arguments_give_a_one_line_usage_error(shell, line, message):
    shell.run_cell(SETUP + "ran = False")
    result, captured = run(shell, f"%%amp_compare {line}\nran = True\nnet(x)")
    text = captured.stderr + captured.stdout
    assert not shell.user_ns["ran"] and message in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1


def test_empty_and_unparsable_cells(shell):
    _, captured = run(shell, "%%amp_compare\n\n")
    assert "there is no code to measure" in captured.stderr + captured.stdout
    _, captured = run(shell, "%%amp_compare\nnet(x x)")
    assert "syntax error" in captured.stderr + captured.stdout


def test_an_error_in_the_cell_shows_the_users_traceback_only(shell):
    shell.run_cell(SETUP + "def inner():\n    return 1 / 0")
    result, captured = run(shell, "%%amp_compare --runs 2\nnet(x)\ninner()")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    out = captured.stdout
    assert "inner()" in out and "return 1 / 0" in out
    assert "torchmagic/" not in out and "run_compare" not in out and "timed_call" not in out
    assert shell.user_ns["net"] is shell.user_ns["original"] and torch.equal(shell.user_ns["net"][0].weight,
                                                                            shell.user_ns["w0"])
    again, _ = run(shell, "1 + 1")
    assert again.success and again.result == 2


def test_a_failing_variant_is_shown_and_the_rest_measured(shell):
    shell.run_cell(SETUP)
    result, captured = run(shell, "%%amp_compare --runs 2 --warmup 0 --variants eager,inference_mode,amp -o r\n"
                                  + TRAIN)
    assert result.success
    r = shell.user_ns["r"]
    assert not r["inference_mode"].ok and r["amp"].ok
    assert "inference_mode failed: " in captured.outputs[0].data["text/plain"].splitlines()[0]  # the headline


def test_displayed_bundle_has_text_html_and_a_chart(shell):
    shell.run_cell(SETUP)
    _, captured = run(shell, "%%amp_compare --runs 6 --warmup 0 --variants eager,amp\nnet(x)")
    data = captured.outputs[0].data
    assert "speedup (95% CI)" in data["text/plain"]
    html = data["text/html"]
    assert "<table" in html and "data:image/png;base64," in html and "95% CI" in html


def test_help_lists_the_options():
    from torchmagic.features.compare.magic import CompareMagics

    doc = CompareMagics.amp_compare.__doc__
    for option in ("--model", "--variants", "--runs", "--min-time", "--warmup", "--dtype", "--accuracy-of",
                   "--atol", "--rtol", "--no-restore", "-o", "-q"):
        assert option in doc
    assert "--output" not in doc  # --accuracy-of's old name, taken until it is removed, is not offered
    assert "the variable holding the cell's output whose error against eager is measured" in " ".join(doc.split())


def test_the_shown_help_offers_accuracy_of_not_its_old_name(shell):
    result, captured = run(shell, "%%amp_compare?")
    assert result.success and "[--accuracy-of NAME]" in captured.stdout and "--output" not in captured.stdout


def test_refuses_to_run_inside_a_running_profiler_and_leaves_it_running(shell):
    shell.run_cell(SETUP + "ran = False")
    with torch.profiler.profile():
        result, captured = run(shell, "%%amp_compare --runs 2\nran = True\nnet(x)")
        assert torch.autograd._profiler_enabled()
        result, captured_ab = run(shell, "%autobatch --budget 1MiB -- net(torch.randn(BS, 32))")
        assert torch.autograd._profiler_enabled()
    assert "already running" in captured.stderr + captured.stdout and not shell.user_ns["ran"]
    assert "already running" in captured_ab.stderr + captured_ab.stdout


AMP_NOTE = ("amp: declared by the test, so bfloat16 autocast is expected to run slower than float32 here; "
            "measuring anyway")
INFERENCE = "with torch.no_grad():\n    pred = net(x)\nprint('ran')"


@pytest.mark.parametrize("fast", [False, True])
def test_amp_on_a_cpu_without_fast_bf16_prints_a_note_before_it_runs(shell, monkeypatch, fast):
    monkeypatch.setattr(CompareMagics, "device", staticmethod(lambda spec, values, magic: FastBf16Cpu(fast=fast)))
    shell.run_cell(SETUP)
    result, captured = run(shell, "%%amp_compare --variants eager,amp --runs 2 --warmup 0 --accuracy-of pred -o r\n"
                                  + INFERENCE)
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert r["amp"].ok and r["amp"].median_s > 0 and r["amp"].dtype == "bfloat16" and r["amp"].numerics_ok
    printed = captured.stdout.splitlines()
    if fast:
        assert AMP_NOTE not in captured.stdout and AMP_NOTE not in r.notes and set(printed) == {"ran"}
    else:
        assert printed[0] == AMP_NOTE and printed.count(AMP_NOTE) == 1  # first, before the cell's own output
        assert set(printed[1:]) == {"ran"} and AMP_NOTE in r.notes
        shown = [o.data["text/plain"] for o in captured.outputs]
        assert any(AMP_NOTE in text for text in shown)  # and kept in the report

    result, captured = run(shell, "%%amp_compare -q --variants eager,amp --runs 2 --warmup 0 --accuracy-of pred -o r\n"
                                  + INFERENCE)
    assert result.success and captured.outputs == [] and AMP_NOTE not in captured.stdout  # -q: no note printed
    assert (AMP_NOTE in shell.user_ns["r"].notes) is not fast


def test_in_a_notebook_the_note_before_the_run_goes_once_the_report_says_it(shell, monkeypatch, capsys):
    """Issue 51: in JupyterLab the AVX2/bf16 note showed twice, once as printed text running off the page."""
    monkeypatch.setattr(CompareMagics, "device", staticmethod(lambda spec, values, magic: FastBf16Cpu(fast=False)))
    monkeypatch.setattr(shell, "kernel", object(), raising=False)  # a Jupyter kernel's shell has one
    published = []
    monkeypatch.setattr(shell.display_pub, "publish", lambda data, *args, **kwargs: published.append(
        (data, kwargs.get("transient", {}).get("display_id"), kwargs.get("update", False))))
    shell.run_cell(SETUP)
    result = shell.run_cell("%%amp_compare --variants eager,amp --runs 2 --warmup 0 -o r\nnet(x)")
    assert result.success, result.error_in_exec
    assert AMP_NOTE not in capsys.readouterr().out  # not printed: an output of its own, wrapped
    shown = [(data, shown_id) for data, shown_id, update in published if AMP_NOTE in data.get("text/plain", "")]
    (notice, notice_id), (report, _) = shown
    assert "tm-note" in notice["text/html"] and notice_id is not None and "tm-headline" in report["text/html"]
    assert (({"text/plain": ""}, notice_id, True)) in published  # gone once the report shows it
