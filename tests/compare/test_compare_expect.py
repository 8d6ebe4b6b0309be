"""%%amp_compare --expect / torchmagic.compare(expect=): the verify of a %%torchprofile finding says whether
what it measured is inside the finding's predicted speedup, and keeps the measurement for the rule."""

import pytest
import torch
from torch import nn

import torchmagic
from torchmagic.core.devices import DeviceInfo
from torchmagic.core.expectations import Expectation, Measured, code_key, measured
from torchmagic.features.compare.result import CompareResult, VariantResult
from torchmagic.features.compare.options import ComparedWith

from ..conftest import run
from .test_compare_magic import SETUP

FAST = "--runs 6 --warmup 0"  # the fewest rounds that give a 95% CI


@pytest.mark.parametrize("line, message", [
    ("--variants eager,amp --expect fast", "--expect takes a speedup range such as 1.15-1.30, got 'fast'"),
    ("--variants eager,amp --expect 1.3-1.1", "--expect the range must be positive, low first"),
    ("--variants eager,amp,inference_mode --expect 1.1-1.3", "--expect judges one variant's speedup: give exactly "
                                                             "one besides eager"),
    ("--expect 1.1-1.3", "exactly one besides eager"),  # the default variants are three
])
def test_bad_expect_gives_a_one_line_usage_error_before_anything_runs(shell, line, message):
    shell.run_cell(SETUP + "ran = False")
    result, captured = run(shell, f"%%amp_compare {line}\nran = True\nnet(x)")
    text = captured.stderr + captured.stdout
    assert not shell.user_ns["ran"] and message in text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1


@pytest.mark.parametrize("expect, verdict", [("0.01-100", "inside the 0.01-100.00x the finding predicted."),
                                             ("50-60", "slower than the 50.00-60.00x the finding predicted; "
                                                       "the finding is contradicted here")])
def test_the_report_judges_the_measurement_and_the_amp_rule_remembers_it(shell, expect, verdict):
    shell.run_cell(SETUP)
    body = f"# expect {expect}\nwith torch.no_grad():\n    pred = net(x)\npred"
    result, captured = run(shell, f"%%amp_compare --variants eager,amp {FAST} --expect {expect} -o r\n{body}")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    check = r.expectation_check
    amp = r["amp"]
    assert check == Measured(amp.speedup, amp.ci, Expectation(*map(float, expect.split("-"))))
    assert r.to_dict()["expectation_check"]["speedup"] == amp.speedup
    lines = captured.outputs[0].data["text/plain"].splitlines()
    assert lines[1].startswith(f"amp ({amp.runs_as}) measured {amp.speedup:.2f}x (95% CI ") and verdict in lines[1]
    assert verdict in captured.outputs[0].data["text/html"]
    assert measured("amp", code_key(body)) == check  # for %%torchprofile's amp rule, on this cell's code


def test_a_plain_comparison_is_remembered_too_under_each_variants_rule(shell):
    shell.run_cell(SETUP)
    body = "# plain\nnet(x)"
    result, _ = run(shell, f"%%amp_compare --variants eager,inference_mode,amp {FAST} -q -o r\n{body}")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert r.expectation_check is None and "measured" not in r.to_text().splitlines()[1]
    for rule, name in (("inference_grad", "inference_mode"), ("amp", "amp")):
        assert measured(rule, code_key(body)) == Measured(r[name].speedup, r[name].ci)


def test_the_api_judges_and_stores_the_check():
    net = nn.Linear(16, 4)
    x = torch.randn(8, 16)
    r = torchmagic.compare(lambda m: m(x), model=net, variants="eager,inference_mode", runs=6, warmup=0,
                           expect="50-60", device="cpu")
    assert r.expectation_check.verdict.outcome == "below" and "the finding is contradicted" in r.to_text()
    r = torchmagic.compare(lambda m: m(x), model=net, variants="eager,inference_mode", runs=6, warmup=0,
                           expect=Expectation(0.01, 100), device="cpu")
    assert r.expectation_check.verdict.outcome == "within" and r.options.expect.text() == "0.01-100.00x"
    with pytest.raises(ValueError, match="expect judges one variant's speedup"):
        torchmagic.compare(lambda m: m(x), model=net, expect="1.1-1.2")
    with pytest.raises(ValueError, match="expect takes a speedup range"):
        torchmagic.compare(lambda m: m(x), model=net, variants="eager,amp", expect="fast")


def test_without_an_interval_the_prediction_is_not_judged():
    eager = VariantResult("eager", median_s=0.01, speedup=1.0)
    amp = VariantResult("amp", median_s=0.008, speedup=1.25)  # 4 rounds: no CI
    r = CompareResult(label="c", device=DeviceInfo("cpu", "cpu", "cpu"), variants=[eager, amp], rounds=4,
                      options=ComparedWith(("eager", "amp"), expect=Expectation(1.15, 1.30)))
    assert r.to_text().splitlines()[1] == ("Not judged against the 1.15-1.30x the finding predicted: amp has no "
                                           "95% CI (too few rounds).")
