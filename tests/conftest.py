import builtins
import os
import signal

import pytest
import torch

torch.manual_seed(0)
# The tests send SIGINT as Jupyter does to a kernel, which handles it.  A shell's background job (`pytest &`,
# job control off) starts with SIGINT ignored, and so does this process then: each Ctrl-C a test sends would be
# dropped (the magics leave an ignored SIGINT ignored), and those tests fail as if the magic had lost it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# One intra-op thread: with two OpenMP threads on a 2-core machine, any other busy process
# (a DataLoader worker, a parallel job) makes every small matmul spin in a barrier for ms,
# which distorts the time shares the rules read.  Tests assert no absolute times but backstops many
# times what the work takes (a hang, or work done before a refusal), which a loaded machine passes.
torch.set_num_threads(1)

# The long matrices (the fault matrix's repetitions and malformed lines, the interrupt sweep's check points) run
# whole where TORCHMAGIC_LONG=1, the nightly-style lane (docs/development.md); the README's test command, and so
# CI, runs a seeded part of each, which still fails on any one traceback, leak or thing left behind.
LONG = os.environ.get("TORCHMAGIC_LONG") == "1"


def pytest_collection_modifyitems(items):
    """The tutorial notebooks' cells (nbval) take minutes together: `-m "not slow"`, the fast lane for
    development, leaves them out (CI runs them)."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _forget_verify_measurements():
    """What a verify measured is kept for the session (core/expectations.py) and read by the next profile of
    the same code or loader: one test's measurements must not decide another's findings."""
    yield
    from torchmagic.core import expectations

    expectations._MEASURED.clear()


@pytest.fixture(scope="session")
def ipython():
    """A real IPython InteractiveShell with torchmagic loaded, shared by the magic tests."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "torchmagic")
    # a terminal shell's formatter shows text/plain alone; the magic tests see what a notebook shows
    shell.display_formatter.active_types = shell.display_formatter.format_types
    return shell


@pytest.fixture
def shell(ipython):
    """The shell with a clean user namespace for each test."""
    ipython.run_cell("import torch")
    _output_history_updating(ipython)
    yield ipython
    for name in [n for n in ipython.user_ns if not n.startswith("_") and n not in ("In", "Out", "get_ipython", "exit", "quit")]:
        ipython.user_ns.pop(name, None)
    _output_history_updating(ipython)


def _output_history_updating(ipython):
    """IPython updates _, __ and ___ only while each is the value its display hook last pushed (the hidden
    names' table holds it) and no `builtins._` exists: a cell's `for _ in ...`, or a test's own `_`, makes _
    the user's and stops the updates for every later test (which then read another test's result as _)."""
    hook = ipython.displayhook
    builtins.__dict__.pop("_", None)
    for unders in ("_", "__", "___"):
        ipython.user_ns[unders] = ipython.user_ns_hidden[unders] = getattr(hook, unders)


def run(shell, source: str, store_history: bool = False):
    """Run a cell in the shell as a notebook would; return IPython's result and what it printed."""
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = shell.run_cell(source, store_history=store_history)
    return result, captured
