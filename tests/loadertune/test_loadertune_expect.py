"""%loadertune --expect / torchmagic.loadertune(expect=): the verify of the profile's dataloader finding says
whether the change's speedup is inside the prediction, and keeps the measurement for the rule."""

import pytest
from torch.utils.data import DataLoader

import torchmagic
from torchmagic.core.expectations import Expectation, Measured, measured

from ..conftest import run
from .test_loadertune import CPU, Tokenising, children

FAST = "--workers 0,1 --seconds 0.02 --rounds 6 --device cpu"  # 6 rounds: the fewest that give a 95% CI


@pytest.mark.parametrize("line, message", [
    ("loader --expect fast", "--expect takes a speedup range such as 1.15-1.30, got 'fast'"),
    ("loader --expect 2-1", "--expect the range must be positive, low first"),
])
def test_bad_expect_gives_a_one_line_usage_error(shell, line, message):
    shell.user_ns.update(loader=DataLoader(Tokenising(n=8, work=1)))
    result, captured = run(shell, f"%loadertune {line}")
    text = captured.stderr + captured.stdout
    assert message in text and "Traceback" not in text and len(text.strip().splitlines()) == 1


def test_the_report_judges_the_change_and_the_dataloader_rule_remembers_it(shell):
    shell.user_ns.update(train_loader=DataLoader(Tokenising(n=256, work=10), batch_size=8))
    for expect, verdict in (("0.01-100", "inside the 0.01-100.00x the finding predicted."),
                            ("50-60", "slower than the 50.00-60.00x the finding predicted; the finding is "
                                      "contradicted here")):
        result, _ = run(shell, f"%loadertune train_loader {FAST} --expect {expect} -o r")
        assert result.success, result.error_in_exec
        r = shell.user_ns["r"]
        change = r.change
        assert change.settings != r.current and r.expectation_check == Measured(
            change.speedup, change.ci, Expectation(*map(float, expect.split("-"))))
        assert result.result is r  # shown as Out[n]: its text and HTML views
        text = r.to_text().splitlines()
        assert text[1].startswith(f"{change.settings.label()} measured ") and verdict in text[1]
        assert verdict in r.to_html()
        assert measured("dataloader", "loader:train_loader") == r.expectation_check
    assert children() == []


def test_a_plain_run_is_remembered_and_the_api_judges_without_remembering(shell):
    loader = DataLoader(Tokenising(n=256, work=10), batch_size=8)
    shell.user_ns.update(plain_loader=loader)
    result, _ = run(shell, f"r = %loadertune plain_loader {FAST}")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert r.expectation_check is None and measured("dataloader", "loader:plain_loader") == r.change.measured()
    api = torchmagic.loadertune(loader, workers=[0, 1], seconds=0.02, rounds=6, device=CPU, expect="50-60")
    assert api.expectation_check.verdict.outcome == "below" and api.options.expect.text() == "50.00-60.00x"
    assert measured("dataloader", "loader:plain_loader") == r.change.measured()  # the API keeps nothing
    with pytest.raises(ValueError, match="expect takes a speedup range"):
        torchmagic.loadertune(loader, expect="1.1")
    assert children() == []
