"""An error in the user's %loadertune --step function or dataset shows the user's frames only
(issue 30): not ours (loadertune/run.py), nor the DataLoader's that we called."""

import pytest
import torch

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


RAISES_ON_ITEM = """
class RaisesOnItem(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if i == 7:
            raise KeyError(f"item {i} is missing")
        return torch.ones(4)
raising = RaisesOnItem()
"""


@pytest.mark.parametrize("workers", ["0", "0,2"])
def test_a_dataset_that_raises_stops_the_tune_with_its_own_error(shell, workers):
    """Issue 51: a dataset raising on item 7 gave "Keep the current settings (num_workers=0)" and no error."""
    shell.run_cell(RAISES_ON_ITEM)
    result, captured = run(shell, f"%loadertune raising batch_size=1 --workers {workers} --batches 20 --rounds 3 -o r")
    error = result.error_in_exec
    assert isinstance(error, KeyError) and "item 7 is missing" in str(error)
    shown = captured.stdout + captured.stderr
    assert "in RaisesOnItem.__getitem__" in shown
    assert "torchmagic/" not in shown and "torch/utils/data" not in shown, shown
    tuned = shell.user_ns["r"]  # the settings measured before it, kept and shown above the error
    assert "Keep the current settings" not in tuned.to_text()
    assert tuned.headline().startswith("Stopped: your dataset or collate function raised KeyError")
    assert tuned.best == tuned.current and tuned.speedup is None
    displayed = "".join(output.data.get("text/plain", "") for output in captured.outputs)
    assert displayed.startswith("Stopped: your dataset"), displayed


def test_a_worker_that_dies_stays_a_failed_setting(shell):
    """The machinery failing under one setting (a worker killed) is that setting's failure, not the user's error."""
    shell.run_cell("""
import os, signal
class KillsWorkers(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.ones(4)
killer = KillsWorkers()
""")
    result, captured = run(shell, "%loadertune killer batch_size=1 --workers 0,1 --batches 5 --rounds 3 -o r")
    assert result.error_in_exec is None, captured.stdout + captured.stderr
    tuned = shell.user_ns["r"]
    failed = [row for row in tuned.rows if row.error is not None]
    assert failed and all(row.settings.num_workers == 1 for row in failed)
    assert "worker" in failed[0].error


def test_the_python_twin_raises_the_datasets_error_with_what_was_measured(shell):
    import torchmagic

    shell.run_cell(RAISES_ON_ITEM)
    loader = torch.utils.data.DataLoader(shell.user_ns["raising"], batch_size=1)
    with pytest.raises(KeyError, match="item 7 is missing") as caught:
        torchmagic.loadertune(loader, workers=[0, 1], batches=20, rounds=3, device="cpu")
    assert caught.value.torchmagic_result.stopped.startswith("Stopped: your dataset")
