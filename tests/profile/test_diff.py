"""torchmagic.diff and %%torchprofile --diff: the step time's ratio with an exact distribution-free
interval, the operators and findings that changed, and the verify button's diff against the profile
that raised the finding."""

import math
import subprocess
import sys

import pytest
import torch

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.core.render import live
from torchmagic.core.measure.stats import unpaired_ratio

from ..conftest import run


def test_the_unpaired_ratio_and_its_exact_interval():
    r = unpaired_ratio([1.0, 1.1, 0.9, 1.05], [2.0, 2.1, 1.9, 2.05])
    assert r.estimate == pytest.approx(0.506, abs=1e-3) and r.sizes == (4, 4)
    # 4 against 4: the interval runs from the least to the largest of the 16 ratios, coverage 1 - 2/70
    assert r.ci == (pytest.approx(0.9 / 2.1), pytest.approx(1.1 / 1.9)) and r.confidence == pytest.approx(1 - 2 / 70)
    assert unpaired_ratio([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]).ci is None  # 3 against 3 cannot reach 95%
    ten = unpaired_ratio([float(i) for i in range(1, 11)], [float(i) for i in range(11, 21)])
    ratios = sorted(a / b for a in range(1, 11) for b in range(11, 21))
    assert ten.ci == (ratios[23], ratios[100 - 24])  # the 24th from each end: U's 5% critical value is 23
    big = unpaired_ratio([1.0 + i / 1000 for i in range(60)], [2.0 + i / 500 for i in range(60)])  # 2x each
    assert big.ci[0] < 0.5 < big.ci[1] and 0.94 < big.confidence <= 1  # the normal approximation past 2500 pairs
    with pytest.raises(ValueError):
        unpaired_ratio([], [1.0])


def _inference(model, x, inference_mode: bool):
    def step():
        if inference_mode:
            with torch.inference_mode():
                return model(x)
        return model(x)

    return step


def test_diff_of_a_fix_reports_the_ratio_and_what_went_away():
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(32, 32), torch.nn.ReLU())])
    x = torch.randn(1, 32)
    kw = {"steps": 6, "warmup": 2, "device": CpuDevice()}
    before = torchmagic.profile(_inference(model, x, False), label="with grad", **kw)
    after = torchmagic.profile(_inference(model, x, True), label="inference_mode", **kw)
    d = torchmagic.diff(before, after)
    assert d.steps == (6, 6) and d.ratio_ci is not None and d.ratio_ci[0] <= d.ratio <= d.ratio_ci[1]
    assert d.ratio == pytest.approx(sorted(a / b for a in after.step_s for b in before.step_s)[17], rel=0.5)
    assert [f.rule for f in d.findings_gone] == ["inference_grad"] and not d.findings_new
    assert d.time_basis == "CPU" and d.op("aten::linear").calls_before == d.op("aten::linear").calls_after == 6
    assert math.isclose(d.speedup, 1 / d.ratio)
    text = d.to_text()
    assert text.startswith("After / before: ") and "gone: inference_grad" in text
    # the fixed finding's prediction, judged against the step time the fix brought
    assert "inference_grad: its fix gone, the step measured" in text and "the finding predicted" in text
    assert "Operators by the change in their self CPU time per step:" in text
    assert "<h4>Findings</h4>" in d.to_html() and d.to_dict()["findings_gone"][0]["rule"] == "inference_grad"
    assert repr(d).startswith("<ProfileDiff: After / before: ")
    with pytest.raises(TypeError, match="before must be a ProfileResult"):
        torchmagic.diff("not a profile", after)


def test_the_magic_diffs_against_a_stored_profile_and_the_verify_button_verifies_against_it(shell):
    shell.run_cell("import torch\nmodel = torch.nn.Linear(64, 64)\nx = torch.randn(1, 64)")
    result, _ = run(shell, "%%torchprofile --steps 4 -q -o before\nfor _ in range(20):\n    model(x)\n")
    assert result.success
    result, captured = run(shell, "%%torchprofile --steps 4 --diff before -o after\n"
                                  "with torch.inference_mode():\n    for _ in range(20):\n        model(x)\n")
    assert result.success, result.error_in_exec
    shown = _displayed(captured)
    assert "After / before: " in shown and "gone: inference_grad" in shown
    assert shell.user_ns["after"].finding("inference_grad") is None
    _, captured = run(shell, "%%torchprofile --diff nothing\nmodel(x)\n")
    assert (captured.stdout + captured.stderr).strip() == (
        "UsageError: %%torchprofile: --diff nothing: not defined, not a profile with a step to compare "
        "(store one with %%torchprofile -o NAME, or save one with NAME.save(PATH))")
    finding = shell.user_ns["before"].finding("inference_grad")
    assert finding.verify == f"%%amp_compare --variants eager,inference_mode {finding.expected.option()}"
    from IPython.utils.capture import capture_output

    with capture_output() as clicked:
        before = shell.user_ns["before"]
        live.runner(before)(before, "%%torchprofile --warmup 1 --steps 4")
    # the button verifies against the profile it belongs to: interleaved rounds, not a diff of two profiles
    clicked = _displayed(clicked)
    assert "Verify: " in clicked and "against _torchprofile_before" in clicked and "After / before: " not in clicked


SAVE_A_PROFILE = """
import sys, torch, torchmagic
model = torch.nn.Linear(64, 64)
x = torch.randn(1, 64)

def step():
    for _ in range(20):
        model(x)

torchmagic.profile(step, steps=4).save(sys.argv[1])
"""


def test_the_magic_diffs_against_a_profile_saved_in_another_process(shell, tmp_path):
    """--diff PATH: a profile written by a script (or yesterday's kernel) with r.save(PATH)."""
    saved = tmp_path / "before.json.gz"
    done = subprocess.run([sys.executable, "-c", SAVE_A_PROFILE, str(saved)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    before = torchmagic.load(saved)
    assert isinstance(before, torchmagic.ProfileResult) and before.finding("inference_grad") is not None
    shell.run_cell("import torch\nmodel = torch.nn.Linear(64, 64)\nx = torch.randn(1, 64)")
    result, captured = run(shell, f"%%torchprofile --steps 4 --diff {saved} -o after\n"
                                  "with torch.inference_mode():\n    for _ in range(20):\n        model(x)\n")
    assert result.success, result.error_in_exec
    shown = _displayed(captured)
    assert "After / before: " in shown and "gone: inference_grad" in shown and str(saved) in shown

    # a trace's analysis saved from one rank holds its profile, as --diff NAME takes one from the notebook
    model, x = shell.user_ns["model"], shell.user_ns["x"]
    torchmagic.profile(lambda: model(x), steps=2, trace=str(tmp_path / "trace.json"))
    torchmagic.analyze(str(tmp_path / "trace.json")).save(tmp_path / "analysis.json")
    result, captured = run(shell, f"%%torchprofile --steps 2 --diff {tmp_path / 'analysis.json'}\nmodel(x)\n")
    assert result.success and "After / before: " in _displayed(captured), captured.stdout + captured.stderr

    shell.user_ns["after"].save(tmp_path / "after.json")
    torchmagic.autobatch(lambda bs: torch.ones(bs).sum(), budget=64 * 2**20, max=8).save(tmp_path / "batch.json")
    (tmp_path / "other.json").write_text('{"traceEvents": []}')
    for path, message in ((tmp_path / "missing.json", "No such file or directory"),
                          (tmp_path / "other.json", "not a result saved by torchmagic"),
                          (tmp_path / "batch.json", "a value of type AutobatchResult, not a profile with a step to compare")):
        _, captured = run(shell, f"%%torchprofile --diff {path}\nmodel(x)\n")
        shown = (captured.stdout + captured.stderr).strip()
        assert shown.startswith(f"UsageError: %%torchprofile: --diff {path}: ") and message in shown, shown
        assert len(shown.splitlines()) == 1


def _displayed(captured) -> str:
    return captured.stdout + "\n".join(o.data.get("text/plain", "") for o in captured.outputs)


def test_energy_per_step_from_nvmls_counter_on_a_gpu():
    from ..fakes import FakeCudaDevice

    device = FakeCudaDevice()
    device.watts = 250.0
    r = torchmagic.profile(lambda: torch.ones(256, 256) @ torch.ones(256, 256), steps=3, device=device)
    # the counter ran at 250 W: a step's joules are 250 W x the seconds between the counter's two reads, which
    # bracket the steps (so never less than their own seconds; how much more depends on the machine's load)
    first, last = device.energy_read_at
    assert r.energy_j_per_step == pytest.approx(250 * (last - first) / 3, abs=1e-3)
    assert 250 * sum(r.step_s) / 3 <= r.energy_j_per_step
    assert "J per step (NVML)" in r.to_text().splitlines()[0]
    assert any(note.startswith("Energy: the profiled steps took") for note in r.notes)  # a short window
    assert torchmagic.profile(lambda: torch.ones(4), device=FakeCudaDevice()).energy_j_per_step is None


RAISING_VALUES = """
class RaisingProfile:
    @property
    def profile(self):
        raise RuntimeError("the user's property raised")
class RaisingGetattr:
    def __getattr__(self, name):
        raise KeyError(name)
raising_property, raising_getattr = RaisingProfile(), RaisingGetattr()
"""


@pytest.mark.parametrize("name, kind", [("raising_property", "RaisingProfile"), ("raising_getattr", "RaisingGetattr")])
def test_diff_against_an_object_whose_attributes_raise_is_refused_in_one_line(shell, name, kind):
    """Issue 51: reading .profile of the user's object ran their property (RuntimeError, KeyError from magic.py)."""
    shell.run_cell(RAISING_VALUES)
    result, captured = run(shell, f"%%torchprofile --diff {name}\nx = 1\n")
    shown = (captured.stdout + captured.stderr).strip()
    assert shown == (f"UsageError: %%torchprofile: --diff {name}: a value of type {kind}, not a profile with a step "
                     "to compare (store one with %%torchprofile -o NAME, or save one with NAME.save(PATH))"), shown
    with pytest.raises(TypeError, match=f"got {kind}"):
        torchmagic.diff(shell.user_ns[name], shell.user_ns[name])


def test_the_python_diff_of_a_profile_without_steps_is_refused_from_the_call(tmp_path):
    """Issue 51: torchmagic.diff of a profile with no step raised from diff.py, inside the package."""
    import dataclasses
    import traceback

    model, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
    done = torchmagic.profile(lambda: model(x), steps=2)
    empty = dataclasses.replace(done, step_s=[])
    with pytest.raises(ValueError) as caught:
        torchmagic.diff(empty, done)
    assert str(caught.value) == ("torchmagic.diff: before (<lambda>): a profile with no complete step, not a profile "
                                 "with a step to compare")
    frames = traceback.extract_tb(caught.value.__traceback__)
    assert [f.filename for f in frames if "torchmagic" in f.filename][-1].endswith("torchmagic/api.py")


def test_a_refused_trace_is_raised_from_the_twin_the_script_called(tmp_path):
    """Issue 51: a trace refused for a negative value raised from traces/run.py; now from torchmagic.analyze."""
    import traceback

    from torchmagic.features.profile.traces.reader import TraceFileError

    path = tmp_path / "negative.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "ProfilerStep#0", "cat": "user_annotation", "ts": 1, '
                    '"dur": -5, "pid": 1, "tid": 1}]}')
    with pytest.raises(TraceFileError) as caught:
        torchmagic.analyze(path)
    assert "'dur' is -5, not a number of 0 or more" in str(caught.value)
    files = [f.filename for f in traceback.extract_tb(caught.value.__traceback__)]
    assert files[-1].endswith("torchmagic/api.py"), files
