"""An error in the user's %autobatch step shows the user's frames only (issue 30): the search's
frames (search.py) are IPython-hidden like the magic's."""

import pytest

from ..conftest import run

STEP = """
model = torch.nn.Linear(4, 4)
def step(bs):
    x = torch.randn(bs, 4)
    if bs > FAIL_ABOVE:
        raise ValueError("the user's own error")
    model(x).sum().backward()
"""


@pytest.mark.parametrize("fail_above, options", [
    (0, ""),                 # at the first size: the estimate's calibration run
    (0, "--no-estimate"),    # at the first fit point
    (8, "--no-estimate"),    # while the search climbs past the fit points
])
def test_an_error_in_the_step_shows_the_users_frames_only(shell, fail_above, options):
    shell.run_cell(STEP)
    shell.user_ns["FAIL_ABOVE"] = fail_above
    result, captured = run(shell, f"%autobatch {options} step")
    assert isinstance(result.error_in_exec, ValueError)
    shown = captured.stdout + captured.stderr
    assert "the user's own error" in shown and "in step(bs)" in shown
    assert "torchmagic/" not in shown, shown
