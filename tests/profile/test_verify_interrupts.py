"""A Ctrl-C wherever one can land in --verify's own code (verify.py, verify_cells.py), in a real IPython shell, as
tests/test_interrupt_sweep.py delivers it for each magic: the user's traceback only, and the model, the optimizer's
settings, the names, torch's settings, the profiler and the SIGINT handler as before the cell."""

import functools
import signal

import pytest

from torchmagic.core import interrupts
from torchmagic.features.profile import verify, verify_cells

from ..checkpoints import describe, points_reached
from ..test_faults import SETUP, assert_unchanged, run, state
from ..test_interrupt_sweep import PACKAGE, _chosen, _run_interrupted_at

pytestmark = pytest.mark.slow

FILES = (verify.__file__, verify_cells.__file__)
CELL = "\nfor _ in range(3):\n    opt.zero_grad()\n    model(x).square().mean().backward()\n    opt.step()"
# the fix changes an optimizer setting: the before side must never see it, nor the user after a Ctrl-C
VERIFIED = "%%torchprofile -q --verify base --expect 1.00-1.20\nopt.param_groups[0]['momentum'] = 0.5" + CELL


def _in_the_rounds(code) -> bool:
    """verify's code that runs before the cell is profiled (keep_last runs after the profile, which trains)."""
    return code.co_filename in FILES and code.co_name != "keep_last"


def test_a_ctrl_c_in_verify_leaves_everything_as_it_was(shell, monkeypatch):
    monkeypatch.setattr(verify_cells, "VerifyOptions", functools.partial(verify.VerifyOptions, min_time=0.02))
    shell.run_cell(SETUP)
    run(shell, "%%torchprofile -q -o base" + CELL)
    chosen = _chosen(points_reached(lambda: run(shell, VERIFIED), _in_the_rounds), "verify")
    names = set(shell.user_ns) | {"_", "__", "___"}
    interrupted = 0
    for point in chosen:
        shell.run_cell(SETUP)
        before = state(shell)
        fired, result, captured = _run_interrupted_at(shell, VERIFIED, point)
        where = f"--verify: Ctrl-C at {describe(point, PACKAGE)}"
        if isinstance(result.error_in_exec, KeyboardInterrupt):
            interrupted += 1
            shown = captured.stdout + captured.stderr
            assert "torchmagic/" not in shown, f"{where}: our frames shown:\n{shown[-2000:]}"
            assert_unchanged(shell, before, where)  # the weights too: the rounds train nothing, and no profile ran
            assert shell.user_ns["opt"].param_groups[0]["momentum"] == 0.9, where
        else:
            assert result.error_in_exec is None, f"{where}: {result.error_in_exec!r}"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not interrupts.is_guarded(), where
        history = {k for k in shell.user_ns if k.startswith("_i") or k.lstrip("_").isdigit()}
        assert set(shell.user_ns) <= names | history, f"{where}: new names {set(shell.user_ns) - names}"
    assert interrupted >= len(chosen) // 2
