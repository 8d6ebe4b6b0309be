"""A cell compared again: a variant whose interval misses the last run's is named, with both intervals; one
whose interval meets it, another model, or another cell is not."""

import gc
import time

import torch

import torchmagic
from torchmagic.core.devices import DeviceInfo
from torchmagic.features.compare import repeated
from torchmagic.features.compare.result import CompareResult, VariantResult

from ..conftest import run

# a step whose time under inference_mode is `factor` times eager's: the true speedup is 1 / factor
SETUP = """
import time
import torch
factor = 1.0
def work():
    end = time.perf_counter() + 2e-3 * (factor if torch.is_inference_mode_enabled() else 1.0)
    while time.perf_counter() < end:
        pass
    return torch.ones(1)
"""
LINE = "%%amp_compare --variants eager,inference_mode --runs 6 --warmup 0 --min-time 0.05 -o r\n"


def test_a_rerun_whose_interval_misses_the_last_says_so_once_and_a_matching_one_says_nothing(shell):
    shell.run_cell(SETUP)
    cell = LINE + "# test_compare_repeated: the magic\nwork()"
    first, _ = run(shell, cell)
    assert first.success, first.error_in_exec
    before = shell.user_ns["r"]
    assert not _moved_notes(before)  # nothing compared before
    # the machine (as far as the cell can tell) runs the variant 4x slower: 0.25x against 1x, intervals apart
    # even on a loaded machine (at 2x, 0.5x against 1x, a busy core once gave 0.60-0.98 for the second)
    shell.user_ns["factor"] = 4.0
    second, captured = run(shell, cell)
    assert second.success, second.error_in_exec
    after = shell.user_ns["r"]
    assert after["inference_mode"].ci[1] < before["inference_mode"].ci[0]  # the premise
    [note] = _moved_notes(after)
    v, last = after["inference_mode"], before["inference_mode"]
    assert note.startswith(f"inference_mode read {v.speedup:.3f}x (95% CI {v.ci[0]:.3f}-{v.ci[1]:.3f}x) here and "
                           f"{last.speedup:.3f}x ({last.ci[0]:.3f}-{last.ci[1]:.3f}x) when this cell was last "
                           "compared, ")
    assert "s ago: the intervals do not meet" in note and "in the same run" in note
    assert note in captured.stdout + "".join(o.data.get("text/plain", "") for o in captured.outputs)
    third, _ = run(shell, cell)  # same speed as the last run: its interval meets that one, unless load moved it
    assert third.success
    again = shell.user_ns["r"]
    assert bool(_moved_notes(again)) is not _meet(again["inference_mode"].ci, after["inference_mode"].ci)


def test_the_api_twin_compares_the_same_function_again(shell):
    state = {"factor": 1.0}

    def work():
        end = time.perf_counter() + 2e-3 * (state["factor"] if torch.is_inference_mode_enabled() else 1.0)
        while time.perf_counter() < end:
            pass
        return torch.ones(1)

    options = dict(variants="eager,inference_mode", runs=6, warmup=0, min_time=0.05)
    before = torchmagic.compare(work, **options)
    assert not _moved_notes(before)
    # 10x: 0.1x against 1x (at 4x, as the magic's test, a loaded CI once gave intervals that met)
    state["factor"] = 10.0
    after = torchmagic.compare(work, **options)
    assert after["inference_mode"].ci[1] < before["inference_mode"].ci[0]  # the premise
    [note] = _moved_notes(after)
    assert "when this function was last compared" in note and "if nothing the function uses changed" in note


def test_only_the_same_code_model_and_setting_is_compared():
    fast, slow = _result(1.0, (0.98, 1.02)), _result(0.5, (0.49, 0.51))
    model = torch.nn.Linear(2, 2)
    assert repeated.compared_again(fast, "cell a", model) == []
    assert repeated.compared_again(slow, "cell b", model) == []  # another cell
    assert repeated.compared_again(slow, "cell a", torch.nn.Linear(2, 2)) == []  # another model
    assert repeated.compared_again(fast, "cell a", model) == []  # kept the last: the other model's run
    assert len(repeated.compared_again(slow, "cell a", model)) == 1
    assert repeated.compared_again(_result(0.52, (0.5, 0.6)), "cell a", model) == []  # meets 0.49-0.51
    # a model created where a collected one was (the same id) is another model
    del model
    gc.collect()
    assert repeated.compared_again(fast, "cell a", torch.nn.Linear(2, 2)) == []


def test_a_variant_without_an_interval_is_neither_judged_nor_kept():
    repeated.compared_again(_result(1.0, (0.98, 1.02)), "cell c", None)
    assert repeated.compared_again(_result(0.5, None), "cell c", None) == []
    assert len(repeated.compared_again(_result(0.5, (0.49, 0.51)), "cell c", None)) == 1


def test_the_kept_runs_are_bounded():
    for i in range(repeated._KEPT + 50):
        repeated.compared_again(_result(1.0, (0.98, 1.02)), f"bounded {i}", None)
    assert len(repeated._LAST) <= repeated._KEPT


def _result(speedup, ci) -> CompareResult:
    return CompareResult("test", DeviceInfo("cpu", "cpu", "cpu"),
                         [VariantResult("eager", speedup=1.0), VariantResult("amp", speedup=speedup, ci=ci)],
                         seconds=1.0)


def _meet(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def _moved_notes(result: CompareResult) -> list[str]:
    return [n for n in result.notes if "the intervals do not meet" in n]
