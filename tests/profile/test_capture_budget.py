"""The profile's host-memory budget (budget.py) on real CPU profiles: the steps stop before one that would
pass it, with a note; a budget that cannot hold one run is refused in one line, nothing left running."""

import threading

import pytest
import torch

import torchmagic
from torchmagic.core.limits import SettingError, parse_budget_text
from torchmagic.features.profile.budget import STOP_FACTOR, CaptureBudget, CaptureBudgetError

from ..conftest import run

# 3,000 tiny ops a step: about 8 MiB of host memory under the profiler here (545 bytes an event, measured),
# so 300 MiB holds a few steps (x14 once stopped) and never the 50 asked, whatever this machine's load
CELL = "calls.append(1)\ny = x\nfor _ in range(3000):\n    y = y + 1"


def test_a_budget_stops_the_steps_before_one_that_would_pass_it_and_says_so(shell):
    shell.user_ns.update(calls=[], x=torch.randn(16, 16))
    threads = {t.ident for t in threading.enumerate()}
    result, _ = run(shell, f"%%torchprofile -q --steps 50 --warmup 1 --capture-budget 300MiB -o r\n{CELL}")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert 1 <= r.steps < 50 and len(shell.user_ns["calls"]) == r.steps + 1  # no step ran un-timed
    note = next(n for n in r.notes if n.startswith("Capture budget:"))
    assert f"{r.steps} of the 50 steps asked were profiled" in note and "300.0 MiB" in note
    assert r.to_text().startswith(f"%%torchprofile: {r.steps} of 50 steps on CPU")
    # the figures are those of the steps that ran, and what they held is within the budget once stopped
    assert r.capture_bytes is not None and r.capture_bytes * STOP_FACTOR <= 300 * 2**20
    assert sum(op.calls for op in r.ops if op.name == "aten::add") == 3000 * r.steps
    assert not torch.autograd._profiler_enabled() and {t.ident for t in threading.enumerate()} <= threads


def test_a_budget_too_small_for_one_run_is_refused_in_one_line_with_nothing_left_running(shell):
    shell.user_ns.update(calls=[], x=torch.randn(16, 16))
    threads = {t.ident for t in threading.enumerate()}
    result, captured = run(shell, f"%%torchprofile --steps 5 --warmup 1 --capture-budget 1MiB -o r\n{CELL}")
    shown = (captured.stdout + captured.stderr).strip()
    assert "too small for one profiled run" in shown and "Traceback" not in shown and len(shown.splitlines()) == 1
    assert "r" not in shell.user_ns and len(shell.user_ns["calls"]) == 2  # the warm-up and the one run measured
    assert not torch.autograd._profiler_enabled() and {t.ident for t in threading.enumerate()} <= threads
    again, _ = run(shell, "%%torchprofile -q -o r\ny = x + 1")  # a profile runs after it
    assert again.success and shell.user_ns["r"].steps == 1


def test_the_api_twin_takes_a_size_and_raises_a_value_error_for_one_too_small():
    x = torch.randn(16, 16)

    def step():
        y = x
        for _ in range(3000):
            y = y + 1

    r = torchmagic.profile(step, steps=50, warmup=1, capture_budget="300MiB")
    assert 1 <= r.steps < 50 and r.options.capture_budget == 300 * 2**20
    with pytest.raises(CaptureBudgetError, match="too small for one profiled run"):
        torchmagic.profile(step, steps=2, warmup=1, capture_budget=2**20)
    assert not torch.autograd._profiler_enabled()


def test_what_a_first_run_keeps_of_its_own_is_not_taken_for_events():
    """Without a warm-up the first profiled run also holds what the cell keeps (here 256 MiB it makes):
    x14 that read as 3.5 GiB and refused a plain profile; only the growth between runs counts then."""
    kept = []

    def cell():
        kept.append(torch.ones(2**26))  # 256 MiB, the first time only
        x = torch.randn(16, 16)
        for _ in range(300):
            x = x + 1

    r = torchmagic.profile(lambda: cell() if not kept else None, steps=1, capture_budget="2GiB")
    assert r.steps == 1 and not any(n.startswith("Capture budget") for n in r.notes)
    kept.clear()
    r = torchmagic.profile(cell, steps=3, capture_budget="2GiB")  # keeps 256 MiB each run: the runs stop
    assert r.steps == 2 and any(n.startswith("Capture budget: 2 of the 3 steps") for n in r.notes)
    kept.clear()


def test_without_a_budget_given_a_small_profile_runs_every_step_under_half_the_available_memory():
    r = torchmagic.profile(lambda: torch.randn(8, 8) @ torch.randn(8, 8), steps=3)
    assert r.steps == 3 and not any(n.startswith("Capture budget") for n in r.notes)
    assert CaptureBudget(None).source.startswith("the default, 0.5 of the")


def test_the_estimate_counts_each_runs_events_by_the_last_run_and_what_the_first_kept_once(monkeypatch):
    held = iter([0, 10, 13, 16])  # MiB: a first run that kept 7 MiB of its own (gradients), then 3 a run
    budget = CaptureBudget(100 * 2**20, warmed=True)
    monkeypatch.setattr(budget, "_read", lambda: next(held) * 2**20)
    budget.start()
    budget.after_run()
    assert budget.estimate(1) == STOP_FACTOR * 10 * 2**20  # one run: all it held is taken as events
    budget.after_run()
    budget.after_run()
    assert budget.estimate(3) == pytest.approx((STOP_FACTOR * 3 * 3 + 7) * 2**20)
    assert budget.stops() == (budget.estimate(4) > 100 * 2**20) and budget.too_small() is None


@pytest.mark.parametrize("text, value", [("2GiB", 2 * 2**30), ("512MB", 512e6), ("0.25", 0.25), ("3e9", 3e9)])
def test_budget_sizes_read_as_the_other_budgets(text, value):
    assert parse_budget_text("capture_budget", text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["lots", "-1GiB", "10KiB", "0"])
def test_bad_budget_sizes_are_refused(text):
    with pytest.raises(SettingError):
        parse_budget_text("capture_budget", text)


def test_a_bad_budget_is_refused_in_one_line_before_the_cell_runs(shell):
    shell.user_ns["calls"] = []
    _, captured = run(shell, "%%torchprofile --capture-budget lots\ncalls.append(1)")
    assert "--capture-budget takes bytes" in captured.stderr + captured.stdout and shell.user_ns["calls"] == []

