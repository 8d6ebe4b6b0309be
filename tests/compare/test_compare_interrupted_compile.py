"""A Ctrl-C during %%amp_compare's compile: the user's frames only, no partial file left in inductor's
cache, and the next compile of the same graph works, in this process and in a fresh one."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from torchmagic.features.compare.interrupted_compile import is_partial

from ..conftest import run

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CELL = ("%%amp_compare --variants eager,compile --runs 2 --warmup 0 --min-time 0.01 -o r\n"
        "with torch.no_grad():\n    y = net(x)\ny")


def _model(shell, name: str, scale: float) -> None:
    """A class of its own per test: dynamo caches compiled code per forward."""
    shell.run_cell(textwrap.dedent(f"""
        import torch
        from torch import nn
        class {name}(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear(8, 8)
            def forward(self, x):
                return torch.tanh(self.linear(x)) * {scale}
        torch.manual_seed(0)
        net, x = {name}(), torch.randn(4, 8)
    """))


def _interrupted_at_first_call(shell, source, where: tuple[str, str]):
    """Run a cell with the SIGINT handler in force called on entering function ``where[1]`` of a file
    whose path ends with ``where[0]`` (torch's own code, in the main thread), as a signal landing there."""
    fired = []

    def tracer(frame, event, arg):
        if not fired and frame.f_code.co_filename.endswith(where[0]) and frame.f_code.co_name == where[1]:
            fired.append(where)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)

    sys.settrace(tracer)
    try:
        return run(shell, source), fired
    finally:
        sys.settrace(None)


@pytest.mark.parametrize("where", [(os.path.join("_dynamo", "symbolic_convert.py"), "run"),  # dynamo tracing
                                   (os.path.join("_inductor", "graph.py"), "codegen")])      # inductor's codegen
def test_a_ctrl_c_in_the_compile_shows_the_users_frames_and_the_next_compile_works(shell, where):
    # a constant of this run's: a graph no cache on disk holds, so inductor compiles it (from the OS's entropy:
    # another test seeding `random` in this worker made it the same constant each run, a graph the cache held)
    _model(shell, "Interrupted" + where[1].title(), 1 + random.SystemRandom().random())
    (result, captured), fired = _interrupted_at_first_call(shell, CELL, where)
    assert fired and isinstance(result.error_in_exec, KeyboardInterrupt)
    shown = captured.stdout + captured.stderr
    assert "y = net(x)" in shown  # the user's line, where the Ctrl-C came
    assert os.sep + "torch" + os.sep not in shown, shown  # none of dynamo's or inductor's ~700 lines
    assert len(shown.splitlines()) < 40, shown

    result, _ = run(shell, CELL)
    assert result.success, result.error_in_exec
    compiled = shell.user_ns["r"]["compile"]
    assert compiled.ok and compiled.graphs >= 1 and compiled.numerics_ok, compiled.notes


# the model both processes compile: the same graph, so the second reads what the first left in the cache
LINKED = textwrap.dedent("""
    import torch
    from torch import nn
    class Linked(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)
        def forward(self, x):
            return torch.tanh(self.linear(x)) * 2.5
    torch.manual_seed(0)
    net, x = Linked(), torch.randn(4, 8)
""")

INTERRUPTED_IN_THE_LINKER = textwrap.dedent("""
    import json, os, signal, threading, time
    import torch
    from torch import nn
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    shell = start_ipython()
    shell.run_line_magic("load_ext", "torchmagic")
    shell.run_cell(LINKED)

    def linker_writing():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                continue
            name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == os.getpgrp() and name.startswith("ld") and writes_a_library(pid):
                return True
        return False

    def writes_a_library(pid):  # the linker has its output open: stopped now, it leaves a cut-off file
        try:
            paths = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            return False
        return any(p.startswith(os.environ["TORCHINDUCTOR_CACHE_DIR"]) and p.endswith(".so") for p in paths)

    killed = []

    def ctrl_c_in_the_linker():  # as a terminal or Jupyter does: SIGINT to the whole process group
        deadline = time.monotonic() + 300
        while not killed and time.monotonic() < deadline:
            if linker_writing():
                killed.append(True)
                os.killpg(0, signal.SIGINT)
            time.sleep(0.001)

    threading.Thread(target=ctrl_c_in_the_linker, daemon=True).start()
    with capture_output() as first:
        interrupted = shell.run_cell(CELL)
    killed.append(False)
    with capture_output():
        again = shell.run_cell(CELL)
    compiled = shell.user_ns["r"]["compile"]
    print(json.dumps({"killed": killed[0], "interrupted": type(interrupted.error_in_exec).__name__,
                      "shown": first.stdout + first.stderr, "again": again.success and compiled.ok,
                      "numerics_ok": compiled.numerics_ok}))
""")

FRESH = LINKED + textwrap.dedent("""
    with torch.no_grad():
        assert torch.allclose(torch.compile(net)(x), net(x), atol=1e-6)
    print("compiled")
""")


def _cache_env(cache) -> dict:
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_VEC_ISA_OK": "1"}


def _ctrl_c_in_the_linker(cache) -> dict:
    """The scenario in a fresh process whose inductor cache is ``cache``: what it saw."""
    os.makedirs(cache)
    script = f"CELL = {CELL!r}\nLINKED = {LINKED!r}\n" + INTERRUPTED_IN_THE_LINKER
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=_cache_env(cache), start_new_session=True, check=False)  # its own process group
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the linker in /proc")
def test_a_ctrl_c_that_kills_the_linker_leaves_no_partial_file_for_any_process(tmp_path):
    """The C++ compile's linker is stopped mid-write by the process group's SIGINT, as in a notebook:
    the empty .so it leaves used to fail every later compile of that graph ("file too short")."""
    for cache in (tmp_path / "first", tmp_path / "second"):
        seen = _ctrl_c_in_the_linker(cache)
        if seen["killed"] or cache.name == "second":
            break
        # The watcher looks for the linker with the .so open every ms; on a loaded machine it can miss that
        # window (the compile then ends whole): no Ctrl-C landed, so nothing was tested.  The scenario runs
        # once more, in a cache of its own; a second miss, or any other failure, still fails.
        print("the Ctrl-C missed the linker; running again. The first attempt:",
              {key: value for key, value in seen.items() if key != "shown"})
    assert seen["killed"] and seen["interrupted"] == "KeyboardInterrupt", seen
    shown = seen["shown"]
    removed = [line for line in shown.splitlines() if line.startswith("interrupted compile: removed the partial file")]
    assert len(removed) >= 1 and all(str(cache) in line for line in removed), shown
    assert "site-packages" not in shown and len(shown.splitlines()) < 30, shown
    assert seen["again"] and seen["numerics_ok"], seen  # the same graph compiles again in that process

    binaries = [os.path.join(root, name) for root, _, names in os.walk(cache) for name in names
                if name.endswith((".so", ".o"))]
    assert binaries and not [path for path in binaries if is_partial(path)]
    fresh = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=600, cwd=ROOT,
                           env=_cache_env(cache), check=False)
    assert fresh.returncode == 0 and "compiled" in fresh.stdout, fresh.stderr[-3000:]


def test_a_cut_off_binary_is_told_from_a_whole_one(tmp_path):
    import sysconfig

    libraries = (os.path.join(root, name) for root, _, names in os.walk(sysconfig.get_paths()["purelib"])
                 for name in names if name.endswith(".so"))
    library = next(path for path in libraries if 4096 < os.path.getsize(path) < 2**21)
    data = open(library, "rb").read()
    assert not is_partial(library)
    for size in (0, 3, 64, len(data) // 2, len(data) - 1):
        cut = tmp_path / f"cut{size}.so"
        cut.write_bytes(data[:size])
        assert is_partial(str(cut)), size
