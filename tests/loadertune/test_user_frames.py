"""An error in the user's %loadertune --step function or dataset shows the user's frames only
(issue 30): not ours (loadertune/run.py), nor the DataLoader's that we called."""

import pytest

from ..conftest import run

CODE = """
class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        if BAD_ITEM:
            raise ValueError("the user's dataset failed")
        return torch.ones(4)
calls = []
def step(batch):
    calls.append(1)
    if len(calls) > FAIL_AFTER:
        raise RuntimeError("the user's step failed")
items = Items()
"""
LINE = "%loadertune items batch_size=8 --workers 0 --batches 2 --rounds 2 --step step -q"


@pytest.mark.parametrize("bad_item, fail_after, message, frame", [
    (False, 0, "the user's step failed", "in step(batch)"),        # the step timed alone
    (False, 5, "the user's step failed", "in step(batch)"),        # the step timed with a loader
    (True, 99, "the user's dataset failed", "in Items.__getitem__"),  # the batch for the step
])
def test_an_error_in_the_step_or_dataset_shows_the_users_frames_only(shell, bad_item, fail_after, message, frame):
    shell.run_cell(CODE)
    shell.user_ns.update(BAD_ITEM=bad_item, FAIL_AFTER=fail_after)
    result, captured = run(shell, LINE)
    assert result.error_in_exec is not None and message in str(result.error_in_exec)
    shown = captured.stdout + captured.stderr
    assert message in shown and frame in shown
    assert "torchmagic/" not in shown and "torch/utils/data" not in shown, shown
