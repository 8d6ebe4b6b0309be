"""Numbers no one can mean are refused in one line before anything runs; options are quoted as in a
shell; code on a magic's line is not expanded by IPython; errors without a message are named."""

import time

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from torchmagic.core.limits import WORKERS_PER_CORE, describe_error, usable_cores

# `ran` records each use of the model, the loader's data and the step: a refusal leaves it empty
SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
ran = []
model = nn.Linear(8, 8)
model.register_forward_pre_hook(lambda module, args: ran.append("model"))
x = torch.randn(4, 8)
class Recorded(TensorDataset):
    def __getitem__(self, i):
        ran.append("loader")
        return super().__getitem__(i)
loader = DataLoader(Recorded(torch.randn(32, 8)), batch_size=4)
def step(bs):
    ran.append("step")
    model(torch.randn(bs, 8)).sum().backward()
"""

REFUSED = [
    ("%%torchprofile --steps 99999999999999999999\nmodel(x)", "steps must be at most 1,000,000"),
    ("%%torchprofile --warmup 99999999999999999999\nmodel(x)", "warmup must be at most 1,000,000"),
    ("%%amp_compare --min-time inf\nmodel(x)", "--min-time must be a number of seconds up to a day"),
    ("%%amp_compare --min-time nan\nmodel(x)", "--min-time must be positive"),
    ("%%amp_compare --runs 99999999999999999999\nmodel(x)", "--runs must be at most 1,000,000"),
    ("%%amp_compare --atol inf\nmodel(x)", "--atol must be a non-negative number"),
    ("%loadertune --seconds inf loader", "--seconds must be a number of seconds up to a day"),
    ("%loadertune --rounds 99999999999999999999 loader", "--rounds must be at most 1,000,000"),
    ("%autobatch --budget 1e999 step", "budget must be a positive number"),
    ("%autobatch --margin nan step", "margin must be in [0, 1)"),
]


def one_line_refusal(shell, source):
    with capture_output() as captured:
        started = time.perf_counter()
        result = shell.run_cell(source)
        seconds = time.perf_counter() - started
    error = result.error_in_exec or result.error_before_exec
    assert isinstance(error, UsageError), (source, error)
    assert "\n" not in str(error) and "Traceback" not in captured.stdout + captured.stderr
    assert shell.user_ns["ran"] == [], (source, shell.user_ns["ran"])  # refused before any work ran
    # a backstop against slow work before the refusal, which takes milliseconds: 10 s passes a loaded machine
    assert seconds < 10, (source, seconds)
    return str(error)


@pytest.mark.parametrize("source, message", REFUSED)
def test_numbers_no_one_can_mean_are_refused_in_one_line_at_once(shell, source, message):
    shell.run_cell(SETUP)
    assert message in one_line_refusal(shell, source)


def test_more_workers_than_the_cores_can_take_are_refused(shell):
    shell.run_cell(SETUP)
    too_many = WORKERS_PER_CORE * usable_cores() + 1
    message = one_line_refusal(shell, f"%loadertune --workers 0,{too_many} loader")
    assert f"--workers {too_many} is more than {WORKERS_PER_CORE}x the {usable_cores()} usable cores" in message


def test_quoted_option_values_lose_their_quotes(shell, tmp_path):
    shell.run_cell(SETUP)
    folder = tmp_path / "with space"
    folder.mkdir()
    result = shell.run_cell(f"%%torchprofile -q -o r --trace '{folder}/t.json'\nmodel(x)")
    assert result.success, result.error_in_exec
    assert (folder / "t.json").exists() and shell.user_ns["r"].trace_path == str(folder / "t.json")
    result = shell.run_cell("%%amp_compare -q -o c --variants 'eager,inference_mode' --runs 2 --min-time 0.01 "
                            "--warmup 0\nmodel(x)")
    assert result.success, result.error_in_exec
    assert [v.name for v in shell.user_ns["c"].variants] == ["eager", "inference_mode"]


def test_autobatch_code_is_not_expanded_by_ipython(shell):
    shell.run_cell(SETUP + "seen = []\nn = 3\n")
    result = shell.run_cell('%autobatch -q --max 4 --no-estimate -- seen.append("{n} $n"); torch.ones(BS)')
    assert result.success, result.error_in_exec
    assert set(shell.user_ns["seen"]) == {"{n} $n"}


def test_a_bare_memory_error_is_out_of_memory_and_named(shell):
    shell.run_cell(SETUP + "def fussy(bs):\n    if bs > 8:\n        raise MemoryError()\n")
    result = shell.run_cell("%autobatch -q -o r --max 64 --no-estimate fussy")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert r.batch_size == 8 and {t.error for t in r.trials if not t.ran} == {"MemoryError"}


def test_errors_are_described_by_their_type_when_they_say_nothing():
    assert describe_error(MemoryError()) == "MemoryError"
    assert describe_error(RuntimeError("  first line\nsecond")) == "RuntimeError: first line"
    assert describe_error(torch.OutOfMemoryError("x" * 400), width=10) == "OutOfMemoryError: " + "x" * 9 + "…"
    assert describe_error(RuntimeError("One. Two three. Four five six."), width=20) == "RuntimeError: One. Two three."
