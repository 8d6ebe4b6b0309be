"""%%torchprofile --verify: a finding's fix timed against the profiled cell in interleaved rounds, ending with a
verdict against the finding's prediction (within, above, below, inconclusive)."""

import dataclasses

import pytest
import torch
from torch import nn

import torchmagic
from torchmagic.core.devices import choose_device
from torchmagic.core.expectations import Expectation, Measured, verdict
from torchmagic.core.ipython import parse_argstring
from torchmagic.core.measure.stats import paired_ratio
from torchmagic.features.profile.magic import ProfileMagics
from torchmagic.features.profile.rules.findings import EXPECTING_MAGICS, VERIFY, Advice, make_finding
from torchmagic.features.profile.verify import BLOCKS, Sides, VerifyOptions, run_verify
from torchmagic.features.profile.verify_cells import VerifyCells
from torchmagic.features.profile.verify_result import VerifyResult

from ..conftest import run
from .contexts import cpu_context

OUTCOMES = {"within", "above", "below", "inconclusive"}
SETUP = ("import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
         "model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(50)])\n"
         "opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)\nx = torch.randn(8, 16)")
STEP = "loss = model(x).square().mean()\nopt.zero_grad()\nloss.backward()\nopt.step()"


def _judged(ratios_per_block: list[list[float]], low: float, high: float):
    """The verdict on rounds whose before/after ratios are given, block by block (after's time 1)."""
    before = [r for block in ratios_per_block for r in block]
    ratio = paired_ratio(before, [1.0] * len(before), blocks=[len(b) for b in ratios_per_block])
    return verdict(Measured(ratio.estimate, ratio.ci, Expectation(low, high)))


def test_the_verdict_reads_the_interval_against_the_predicted_range():
    tight = [[1.10, 1.11], [1.12, 1.10], [1.11, 1.13], [1.12, 1.11], [1.10, 1.12], [1.11, 1.12]]
    assert _judged(tight, 1.00, 1.27).outcome == "within"
    assert _judged(tight, 1.20, 1.50).outcome == "below"
    assert _judged(tight, 0.80, 1.05).outcome == "above"
    edge = _judged(tight, 1.00, 1.115)  # the interval 1.10-1.13 reaches across the upper edge
    assert edge.outcome == "inconclusive" and "upper edge (1.11x)" in edge.reason
    noisy = [[0.7, 1.6], [1.9, 0.8], [1.2, 0.6], [1.5, 1.0], [0.9, 2.0], [1.3, 0.75]]  # block medians 0.9-1.45
    wide = _judged(noisy, 1.00, 1.27)
    assert wide.outcome == "inconclusive" and "wider than the 1.00-1.27x predicted" in wide.reason
    # however wide, an interval wholly on one side of the range still gives a verdict
    assert _judged([[r * 3 for r in block] for block in noisy], 1.00, 1.27).outcome == "above"


def test_too_few_blocks_for_an_interval_read_inconclusive():
    r = VerifyResult(before="prof", after="this cell", speedup=1.2, ci=None, confidence=None, rounds=5, blocks=5,
                     before_s=0.012, after_s=0.010, expected=Expectation(1.0, 1.27))
    assert r.verdict.outcome == "inconclusive" and "needs 6 blocks" in r.verdict.reason
    assert r.to_text().splitlines()[-1].startswith("Verdict: inconclusive")
    assert VerifyResult(**{**dataclasses.asdict(r), "expected": None}).to_text().splitlines()[-1].startswith(
        "No verdict")


def test_every_verify_command_carries_what_gives_its_verdict():
    """Each rule's command names a magic that judges --expect, and a %%torchprofile one verifies against the
    profile (by its -o name, else the last one) with the line the magic parses."""
    no_prediction = {rule for rule, command in VERIFY.items() if command.lstrip("%").split()[0] not in EXPECTING_MAGICS}
    assert no_prediction == {"batch_size"}  # %autobatch finds a batch size: there is no speedup to predict
    for name in ("prof", None):
        ctx = cpu_context(user=dataclasses.replace(cpu_context().user, profile=name))
        for rule, command in VERIFY.items():
            finding = make_finding(rule, ctx, 0.2, "t", {}, Advice("fix", "snippet", Expectation(1.0, 1.27)))
            if rule in no_prediction:
                continue
            assert finding.verify.endswith(" --expect 1.00-1.27"), finding.verify
            if command.startswith("%%torchprofile"):
                args = parse_argstring(ProfileMagics.torchprofile, finding.verify.split(maxsplit=1)[1], "%%torchprofile")
                assert (args.verify, args.expect) == (name or "", "1.00-1.27")


def test_each_side_runs_from_the_start_and_everything_is_put_back():
    """The after side's fix (an optimizer setting, a name it binds) never reaches the before side, and the
    weights, the setting and the names are as they were once the rounds end."""
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    weights = model.weight.detach().clone()
    namespace = {"model": model, "opt": opt}
    seen = []

    def step():
        opt.zero_grad()
        model(torch.randn(4, 8)).square().sum().backward()
        opt.step()

    def before():
        seen.append((opt.param_groups[0]["foreach"], "fixed" in namespace))
        step()

    def after():
        opt.param_groups[0]["foreach"] = True
        namespace["fixed"] = True
        step()

    outcome = run_verify(Sides(before, after), VerifyOptions(min_time=0.05), state=[model, opt],
                         device=choose_device("cpu"), namespace=namespace)
    assert outcome.error is None and outcome.result.blocks == BLOCKS and outcome.result.ci is not None
    assert set(seen) == {(False, False)} and len(seen) > outcome.result.rounds
    assert torch.equal(model.weight, weights) and opt.param_groups[0]["foreach"] is False
    assert set(namespace) == {"model", "opt"}


def test_the_python_twin_verifies_code_against_its_profile(tmp_path):
    namespace = {}
    exec(SETUP, namespace)
    before = torchmagic.profile_code(STEP, namespace, warmup=1, steps=2)
    assert before.code == STEP
    after = torchmagic.profile_code("for g in opt.param_groups:\n    g['foreach'] = True\n" + STEP, namespace,
                                    steps=2, verify=before, expect="1.00-1.50")
    assert after.verified.verdict.outcome in OUTCOMES and after.verified.rounds >= 2 * BLOCKS
    assert namespace["opt"].param_groups[0]["foreach"] is True  # the profile ran the fixed code, as the user's
    loaded = torchmagic.load(after.save(tmp_path / "after.json"))
    assert loaded.verified == after.verified and loaded.verified.verdict == after.verified.verdict
    with pytest.raises(ValueError, match="expect.*goes with verify"):
        torchmagic.profile_code(STEP, namespace, expect="1.00-1.50")


def _verdict_line(captured) -> str:
    shown = [o.data.get("text/plain", "") for o in captured.outputs]
    return shown[-1].splitlines()[-1] if shown else ""


def test_the_optimizer_findings_verify_command_after_its_fix_ends_with_a_verdict(shell):
    shell.run_cell(SETUP)
    run(shell, f"%%torchprofile -q -o prof --warmup 1 --steps 3\n{STEP}")
    finding = shell.user_ns["prof"].finding("optimizer")
    assert finding is not None and finding.verify.startswith("%%torchprofile --warmup 1 --steps 5 --verify prof ")
    assert finding.verify.endswith(finding.expected.option())
    result, captured = run(shell, f"{finding.verify} -o after\n{finding.snippet}\n{STEP}")
    assert result.success, result.error_in_exec
    line = _verdict_line(captured)
    assert line.startswith("Verdict: ") and line.split()[1] in OUTCOMES, line
    assert finding.expected.text() in line and "95% CI" in line
    verified = shell.user_ns["after"].verified
    assert line.split()[1] == verified.verdict.outcome and verified.expected.text() == finding.expected.text()
    # the cell ran as the user's afterwards: its fix stays, and the profile of the fixed cell is shown too
    assert shell.user_ns["opt"].param_groups[0]["fused"] is True
    assert any("%%torchprofile:" in o.data.get("text/plain", "") for o in captured.outputs)


@pytest.mark.parametrize("expect, allowed", [("3.00-5.00", {"below", "inconclusive"}),
                                             ("0.80-1.25", {"within", "inconclusive"})])
def test_the_profiled_cell_itself_is_never_a_fix_within_a_prediction_far_above_1(shell, expect, allowed):
    shell.run_cell("w = torch.randn(96, 96)")
    cell = "for _ in range(4):\n    y = torch.tanh(w @ w)"
    run(shell, f"%%torchprofile -q -o same\n{cell}")
    result, captured = run(shell, f"%%torchprofile -q -o again --verify same --expect {expect}\n{cell}")
    assert result.success, result.error_in_exec
    verified = shell.user_ns["again"].verified
    assert verified.verdict.outcome in allowed, verified.to_text()
    assert "the profiled code itself" in verified.notes[0]


def test_a_bare_verify_takes_the_last_profiled_cell_and_its_own_profile_does_not_replace_it(shell):
    run(shell, "%%torchprofile -q -o first\nz = torch.ones(64) * 2")
    first = shell.user_ns["first"]
    run(shell, "%%torchprofile -q -o checked --verify --expect 0.50-2.00\nz = torch.ones(64) * 3")
    assert shell.user_ns["checked"].verified.before == "the last profiled cell"
    magics = shell.magics_manager.registry["ProfileMagics"]
    assert magics.last_verify_base == first.code and torch.equal(shell.user_ns["z"], torch.full((64,), 3.0))


def test_a_cell_failing_in_the_rounds_shows_its_error_and_leaves_the_model_as_it_was(shell):
    shell.run_cell("lin = torch.nn.Linear(8, 8)\nsgd = torch.optim.SGD(lin.parameters(), lr=0.5)\ncalls = []")
    cell = "sgd.zero_grad()\nlin(torch.ones(2, 8)).sum().backward()\nsgd.step()"
    run(shell, f"%%torchprofile -q -o base\n{cell}")
    weights = shell.user_ns["lin"].weight.detach().clone()
    result, captured = run(shell, f"%%torchprofile --verify base --expect 1.00-1.20\ncalls.append(1)\n"
                                  f"if len(calls) > 6:\n    raise ValueError('boom')\n{cell}\nmade = 1")
    assert isinstance(result.error_in_exec, ValueError) and str(result.error_in_exec) == "boom"
    assert torch.equal(shell.user_ns["lin"].weight, weights) and "made" not in shell.user_ns
    shown = captured.stdout + captured.stderr
    assert "boom" in shown and "torchmagic" not in shown.replace("%%torchprofile", "")  # the user's frames only


@pytest.mark.parametrize("line, message", [
    ("--verify nothing_here", "--verify nothing_here: is not defined, not a profile"),
    ("--verify number", "--verify number: holds a int, not a profile"),
    ("--verify a.b", "takes the name of a stored profile"),
    ("--expect 1.0-1.2", "--expect goes with --verify"),
    ("--verify prof_fn --expect 1.0-1.2", "not of a cell"),
    ("--verify prof_cell --expect fast", "--expect takes a speedup range"),
])
def test_bad_verify_lines_are_one_line_errors_and_run_nothing(shell, line, message):
    shell.user_ns.update(number=3, prof_fn=torchmagic.profile(lambda: torch.ones(2) * 2))
    run(shell, "%%torchprofile -q -o prof_cell\nran = 0")
    result, _ = run(shell, f"%%torchprofile {line}\nran = 1")
    assert type(result.error_in_exec).__name__ == "UsageError" and message in str(result.error_in_exec)
    assert shell.user_ns["ran"] == 0


def test_a_reports_button_verifies_against_the_profile_it_belongs_to():
    assert VerifyCells.against("%%torchprofile --warmup 1 --steps 5 --verify prof --expect 1.00-1.27", "_b") == \
        "%%torchprofile --warmup 1 --steps 5 --verify _b --expect 1.00-1.27"
    assert VerifyCells.against("%%torchprofile --verify --expect 1.00-1.27", "_b") == \
        "%%torchprofile --verify _b --expect 1.00-1.27"
    assert VerifyCells.against("%%torchprofile --warmup 1 --steps 5", "_b") == "%%torchprofile --warmup 1 --steps 5 --verify _b"
