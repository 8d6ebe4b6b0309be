"""What %gpumem --free may delete, and a --watch that nothing can leave running: in a real IPython
InteractiveShell (issue 30)."""

import gc
import threading

import pytest
import torch

from torchmagic.core.limits import SettingError
from torchmagic.features.memory.watch import MemoryWatch

from ..conftest import run

WATCH_THREAD = "torchmagic-memory-watch"


def _watch_threads() -> int:
    return sum(t.name == WATCH_THREAD for t in threading.enumerate())


@pytest.mark.parametrize("names", ["_oh", "Out", "In _ih", "exit quit get_ipython", "_i _ii _iii", "__builtins__"])
def test_free_refuses_ipythons_own_names_in_one_line_and_the_shell_still_works(shell, names):
    run(shell, "40 + 2", store_history=True)  # Out, _, _N, _i ... all exist
    before = {n: shell.user_ns[n] for n in names.split()}
    result, captured = run(shell, f"%gpumem --free {names}", store_history=True)
    text = captured.stderr + captured.stdout
    assert not result.success and "Traceback" not in text and len(text.strip().splitlines()) == 1
    assert "IPython's own" in text and all(n in text for n in names.split())
    # nothing deleted (the input history's _i, _ii, _iii move on with every cell)
    assert all(shell.user_ns[n] is v or n.startswith("_i") for n, v in before.items())
    result, _ = run(shell, "1 + 1", store_history=True)
    assert result.success and shell.user_ns["_"] == 2 and shell.user_ns["Out"][result.execution_count] == 2


def test_ipythons_underscore_is_refused_but_a_users_own_is_freed(shell):
    run(shell, "torch.ones(3)", store_history=True)  # IPython's _
    result, captured = run(shell, "%gpumem --free _", store_history=True)
    assert not result.success and "IPython's own" in captured.stderr + captured.stdout
    try:
        shell.run_cell("_ = torch.zeros(2**18)")  # the user's own _: theirs to free
        result, _ = run(shell, "%gpumem --free _", store_history=True)
        assert result.success, result.error_in_exec
        assert result.result.freed.names == ["_"]
    finally:
        for name in ("_", "__"):
            shell.user_ns.pop(name, None)


def test_free_without_names_keeps_the_users_own_underscore_variables(shell):
    try:
        shell.run_cell("_ = torch.zeros(2**18)\n__ = torch.ones(2**18)\nx = torch.ones(4)")
        mine = shell.user_ns["_"], shell.user_ns["__"]
        for line in ("%gpumem --free", "%gpumem --free x"):
            result, _ = run(shell, line, store_history=True)
            assert result.success, result.error_in_exec
            assert (shell.user_ns["_"], shell.user_ns["__"]) == mine  # the very tensors, not ""
        listed = {v.name for v in run(shell, "%gpumem", store_history=True)[0].result.variables}
        assert {"_", "__"} <= listed  # and the report counts them as the user's variables
    finally:
        for name in ("_", "__"):
            shell.user_ns.pop(name, None)


def test_a_name_given_twice_is_freed_once(shell):
    shell.run_cell("twice = torch.zeros(2**18)")
    result, captured = run(shell, "%gpumem --free twice twice", store_history=True)
    assert result.success, captured.stderr + captured.stdout
    assert result.result.freed.names == ["twice"] and "twice" not in shell.user_ns


@pytest.mark.parametrize("value", ["inf", "0", "nan", "1e9", "0.001"])
def test_watch_intervals_no_one_can_mean_are_refused_in_one_line(shell, value):
    result, captured = run(shell, f"%gpumem --watch {value}")
    text = captured.stderr + captured.stdout
    assert not result.success and "Traceback" not in text and len(text.strip().splitlines()) == 1
    assert "--watch: must be between 0.01 and 3600 seconds" in text and _watch_threads() == 0


@pytest.mark.parametrize("interval", [float("inf"), 0.0, float("nan")])
def test_the_python_watch_refuses_them_too(interval):
    with pytest.raises(SettingError, match="interval must be between"):
        MemoryWatch([], interval)
    assert _watch_threads() == 0


@pytest.mark.parametrize("command", ["%reload_ext torchmagic", "%unload_ext torchmagic"])
def test_unloading_the_extension_stops_the_watch(shell, command):
    try:
        assert run(shell, "%gpumem --watch 0.02")[0].success and _watch_threads() == 1
        result, _ = run(shell, command)
        assert result.success, result.error_in_exec
        assert _watch_threads() == 0
    finally:
        shell.run_line_magic("reload_ext", "torchmagic")


def test_a_watch_does_not_outlive_the_magics_that_started_it():
    from torchmagic.features.memory.magic import MemoryMagics

    magics = MemoryMagics(shell=None)  # the shell keeps its magics: they go when it goes
    magics._start_watch(0.02)
    assert _watch_threads() == 1
    del magics
    gc.collect()
    assert _watch_threads() == 0
