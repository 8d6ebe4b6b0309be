"""%gpumem and %%gpumem in a real IPython InteractiveShell (CPU: no GPU here)."""

import threading
import time
import weakref

import pytest
import torch

from torchmagic.features.memory.result import MemoryResult
from torchmagic.features.memory.watch_result import WatchResult

from ..conftest import run

MiB = 2**20


def test_line_magic_returns_the_result_and_lists_variables(shell):
    shell.run_cell("import torch\nweights = torch.zeros(2**20)\nsmall = torch.zeros(8)")
    result, captured = run(shell, "r = %gpumem")
    assert result.success and captured.outputs == []
    r = shell.user_ns["r"]
    assert isinstance(r, MemoryResult) and r.variables[0].name == "weights" and r.variables[0].bytes == 4 * MiB
    assert not any(v.name == "r" for v in r.variables)
    result, captured = run(shell, "%gpumem --top 1")  # shown as the cell's output, as a line magic's value is
    assert isinstance(result.result, MemoryResult)
    assert "weights" in captured.stdout and "… 1 more variable not shown" in captured.stdout
    assert "<table" in result.result._repr_mimebundle_()["text/html"]


def test_free_reclaims_what_the_output_history_and_a_traceback_pinned(shell):
    shell.run_cell("import torch\nbig = torch.zeros(8 * 2**20)\nkeep = torch.ones(2)")
    ref = weakref.ref(shell.user_ns["big"])
    run(shell, "big", store_history=True)  # now Out[n], _n, _ and the shell's own copies hold it
    run(shell, "def f(t):\n    raise ValueError('x')\nf(big)", store_history=True)  # and the traceback
    result, captured = run(shell, "%gpumem --free big", store_history=True)
    assert result.success, result.error_in_exec
    assert ref() is None
    r = result.result
    assert r.freed.still_alive_tensors == 0 and {"_", "the last traceback"} <= set(r.freed.dropped)
    assert any(d.startswith("Out[") for d in r.freed.dropped)
    assert r.freed.reclaimed["host, resident"] > 16 * MiB  # 32 MiB of zeros handed back to the OS
    assert "keep" in shell.user_ns and "big" not in shell.user_ns


def test_autograd_graphs_are_flagged_on_variables_and_history(shell):
    shell.run_cell("import torch\nw = torch.randn(256, 256, requires_grad=True)\n"
                   "loss = (torch.randn(64, 256) @ w).relu().sum()")
    r = run(shell, "%gpumem", store_history=True)[0].result
    row = next(v for v in r.variables if v.name == "loss")
    assert row.graphs == 1 and "Tensor + autograd graph" in r.to_text()
    before = r.pinned_graphs.get("history", 0)  # the shared shell's history may hold earlier tests' outputs
    run(shell, "loss", store_history=True)
    run(shell, "del loss", store_history=True)
    r = run(shell, "%gpumem", store_history=True)[0].result
    assert r.pinned_graphs["history"] == before + 1  # one tensor, though Out, _ and _N all hold it
    (line,) = [line for line in r.pinned_lines() if "output history" in line]
    assert "plus the autograd graph" in line and "not counted" in line


def test_free_without_names_drops_what_only_the_history_holds(shell):
    shell.run_cell("import torch\nshown = torch.zeros(4 * 2**20)\nkeep = torch.ones(2)")
    ref = weakref.ref(shell.user_ns["shown"])
    run(shell, "shown", store_history=True)
    run(shell, "del shown", store_history=True)
    result, _ = run(shell, "%gpumem", store_history=True)
    assert any("output history" in line and "%gpumem --free drops it" in line for line in result.result.pinned_lines())
    result, _ = run(shell, "%gpumem --free", store_history=True)  # the hint, followed as printed
    assert result.success, result.error_in_exec
    assert ref() is None and "keep" in shell.user_ns
    assert any(d.startswith("Out[") for d in result.result.freed.dropped)


def test_cell_magic_measures_the_cell_and_keeps_its_variables(shell):
    result, captured = run(shell, "%%gpumem -o m\nkept = torch.ones(5 * 2**20)\nscratch = torch.ones(2**20); del scratch\n"
                                  "kept.shape[0]")
    assert result.success and result.result == 5 * MiB
    m = shell.user_ns["m"]
    assert abs(m.cell.net_bytes - 20 * MiB) <= 0.01 * 20 * MiB
    assert abs(m.cell.peak_bytes - 24 * MiB) <= 0.01 * 24 * MiB
    assert [v.name for v in m.cell.new_variables] == ["kept"]
    assert "the cell peaked at 24.0 MiB and kept 20.0 MiB on cpu" in captured.outputs[0].data["text/plain"]


def test_an_error_in_the_cell_shows_the_figures_then_the_users_traceback(shell):
    shell.run_cell("def inner():\n    return 1 / 0")
    result, captured = run(shell, "%%gpumem\nx = torch.ones(1000)\ninner()")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert "the cell peaked at" in captured.outputs[0].data["text/plain"]
    assert "return 1 / 0" in captured.stdout and "torchmagic/" not in captured.stdout
    assert "x" in shell.user_ns  # assignments before the error stay, as in any cell


@pytest.mark.parametrize("line, message", [
    ("--top 0", "--top must be at least 1"),
    ("--free nothere", "not defined: nothere"),
    ("--watch -1", "--watch: must be between 0.01 and 3600 seconds, got -1"),
    ("--watch fast", "invalid float value"),
    ("--stop", "no watch is running"),
    ("--reset --stop", "use one of --reset, --stop at a time"),
    ("-o 1x", "-o needs a Python variable name"),
    ("--bogus", "unrecognized arguments"),
])
def test_bad_arguments_give_a_one_line_usage_error(shell, line, message):
    result, captured = run(shell, f"%gpumem {line}")
    text = captured.stderr + captured.stdout
    assert message in text and "Traceback" not in text and len(text.strip().splitlines()) == 1


def test_cell_magic_refuses_line_actions(shell):
    shell.user_ns["ran"] = False
    result, captured = run(shell, "%%gpumem --reset\nran = True")
    assert "--reset is for the line magic" in captured.stderr + captured.stdout and not shell.user_ns["ran"]


def test_reset_on_cpu_says_there_is_nothing_to_reset(shell):
    result, captured = run(shell, "%gpumem --reset")
    if torch.cuda.is_available():  # a GPU machine: its counters are reset, or it has none yet
        expected = ("peak counters reset on cuda:", "this process has not used a GPU yet")
    else:
        expected = ("torch keeps no peak counters on the CPU",)
    assert result.success and any(e in captured.stdout for e in expected), captured.stdout


def test_watch_starts_and_stops_from_the_shell_leaving_no_thread(shell):
    threads = set(threading.enumerate())
    result, captured = run(shell, "%gpumem --watch 0.02")
    assert result.success and "watching every 0.02 s" in captured.stdout
    assert any(t.name == "torchmagic-memory-watch" for t in threading.enumerate())
    run(shell, "%gpumem --watch 0.05")  # a second watch replaces the first
    assert sum(t.name == "torchmagic-memory-watch" for t in threading.enumerate()) == 1
    shell.run_cell("grow = [torch.ones(2**20) for _ in range(8)]")
    time.sleep(0.3)
    result, _ = run(shell, "w = %gpumem --stop")
    w = shell.user_ns["w"]
    assert isinstance(w, WatchResult) and len(w.samples) >= 3 and not w.running
    assert set(threading.enumerate()) == threads


def test_help_lists_the_options():
    from torchmagic.features.memory.magic import MemoryMagics

    doc = MemoryMagics.gpumem.__doc__
    for option in ("--free", "--reset", "--watch", "--stop", "--top", "-o", "-q", "%%gpumem"):
        assert option in doc


def test_free_refuses_code_and_values_without_tensors_and_deletes_nothing(shell):
    """Issue 51: --free json answered "deleted: json" (torch too); names holding no tensor memory are refused."""
    shell.run_cell("import json\nimport functools\ndef helper():\n    pass\nclass Holder:\n    pass\n"
                   "count = 3\nkept = torch.ones(1024)\npartial = functools.partial(print)")
    for name, why in (("json", "is a module"), ("torch", "is a module"), ("helper", "is a function"),
                      ("Holder", "is a class"), ("partial", "is a function"), ("count", "holds no tensor memory (it is int)")):
        result, captured = run(shell, f"%gpumem --free kept {name}")
        shown = (captured.stdout + captured.stderr).strip()
        assert shown == (f"UsageError: %gpumem --free: {name} {why}: --free deletes variables that hold tensors "
                         "(nothing was freed)"), shown
        assert name in shell.user_ns and "kept" in shell.user_ns
    result, captured = run(shell, "%gpumem --free kept -q")
    assert result.success and "kept" not in shell.user_ns
