"""%%torchprofile --ranks with hostile cells and settings: a rank short of steps is refused, nothing
the ranks start outlives the job (a helper in a session of its own, DataLoader's pymp-* folders), a
rank's huge line is shown cut, and --trace, --share and --nnodes are one line before anything runs."""

import gc
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref

import psutil
import pytest

import torchmagic
from torchmagic.core.limits import SettingError
from torchmagic.core.ranks.share import pickle_shared

from ...conftest import run
from ...processes import assert_left_as_it_was, process_state

HOSTILE_CELL = '''%%torchprofile --ranks 2 --steps 3 --trace {kept}
import subprocess, sys, torch, torch.distributed as dist
rank = dist.get_rank()
if rank == 0:
    print("x" * (8 << 20))  # one 8 MiB line
    list(torch.utils.data.DataLoader(range(8), num_workers=2))
else:
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    print("helper", helper.pid)
dist.barrier()
for _ in range(3 if rank == 0 else 1):
    prof.step()
'''


def test_a_rank_short_of_steps_is_refused_and_the_job_leaves_nothing(shell, tmp_path, monkeypatch):
    scratch, kept = tmp_path / "tmp", tmp_path / "kept"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # where the ranks' temporary files would go
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = process_state()
    _, captured = run(shell, HOSTILE_CELL.format(kept=kept))
    shown = (captured.stdout + captured.stderr).strip()
    assert shown.splitlines()[-1] == ("UsageError: %%torchprofile: --warmup and --steps: the cell called prof.step() "
                                      "1 time(s) on rank 1: too few for 0 warm-up and 3 profiled step(s) (3 calls)")
    helper = int(re.search(r"\[rank 1\] helper (\d+)", shown).group(1))
    assert not psutil.pid_exists(helper) or psutil.Process(helper).status() == psutil.STATUS_ZOMBIE
    long_line = next(line for line in shown.splitlines() if line.startswith("[rank 0] xxx"))
    assert len(long_line) < 10_100 and long_line.endswith("more characters not shown)")
    assert os.listdir(scratch) == [] and not kept.exists()  # no pymp-*, no job folder, no trace of a failed job
    assert_left_as_it_was(before)


def test_trace_share_and_nodes_are_one_line_before_any_rank_starts(shell, tmp_path):
    (tmp_path / "rank0.pt.trace.json").write_text("yesterday's")
    (tmp_path / "file").write_text("mine")
    shell.user_ns["conn"] = socket.socket()
    fds_with_socket = psutil.Process().num_fds()
    for line, message in [
        (f"--trace {tmp_path}", f"--trace-overwrite is needed to replace '{tmp_path / 'rank0.pt.trace.json'}'"),
        (f"--trace {tmp_path / 'file'}", "--trace with --ranks names a folder for the ranks' traces"),
        ("--trace /proc/self/traces", "is the kernel's, not storage"),
        ("--share conn", "--share conn: cannot be sent to the ranks (TypeError: cannot pickle 'socket' object)"),
        ("--nnodes 99999999 --master h:1", "--nnodes must be at most 131,072"),
        ("--nnodes 100000 --master h:1", "--nnodes times --ranks must be at most 131,072 ranks in all"),
    ]:
        before = process_state()
        _, captured = run(shell, f"%%torchprofile --ranks 2 {line}\nx = 2\n")
        shown = (captured.stdout + captured.stderr).strip()
        assert shown.startswith("UsageError: %%torchprofile: ") and message in shown and "\n" not in shown, shown
        assert_left_as_it_was(before)
    assert (tmp_path / "rank0.pt.trace.json").read_text() == "yesterday's"
    del shell.user_ns["conn"]  # the refusal kept no reference to it: its socket is closed
    gc.collect()
    assert psutil.Process().num_fds() == fds_with_socket - 1


def test_the_python_twin_refuses_a_kept_trace_before_any_rank_starts(tmp_path):
    (tmp_path / "rank0.pt.trace.json").write_text("yesterday's")
    before = process_state()
    with pytest.raises(SettingError, match="trace_overwrite is needed to replace"):
        torchmagic.profile_ranks("x = 2", 2, trace=str(tmp_path))
    assert_left_as_it_was(before)
    assert (tmp_path / "rank0.pt.trace.json").read_text() == "yesterday's"


NOTEBOOK_KILLED = '''
import torchmagic
torchmagic.profile_ranks("""
import os, pathlib, subprocess, time
worker = subprocess.Popen(["sleep", "120"])  # in the rank's process group, as a DataLoader worker is
pathlib.Path(%r, "rank" + os.environ["RANK"]).write_text(f"{os.getpid()} {worker.pid}")
time.sleep(120)
""", 2)
'''


@pytest.mark.slow
def test_the_ranks_and_their_workers_end_when_the_notebooks_process_is_killed(tmp_path):
    """An out-of-memory kill of the kernel leaves no rank holding memory or a GPU."""
    notebook = subprocess.Popen([sys.executable, "-c", NOTEBOOK_KILLED % str(tmp_path)], start_new_session=True)
    files = [tmp_path / "rank0", tmp_path / "rank1"]
    deadline = time.monotonic() + 120
    while not all(f.exists() and f.read_text() for f in files):
        assert notebook.poll() is None and time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    pids = [int(pid) for f in files for pid in f.read_text().split()]
    notebook.kill()
    notebook.wait()
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in alive:  # not to leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"{len(alive)} of the job's {len(pids)} processes outlived the notebook"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class _Bytes:
    """Stands for the bytes torch's ``__reduce__`` makes of a tensor's storage."""


made: list = []


class _InterruptedWhilePickled:
    def __reduce__(self):
        data = _Bytes()
        data.payload = bytearray(1 << 20)
        made.append(weakref.ref(data))
        raise KeyboardInterrupt  # a Ctrl-C while the storage's bytes are alive in this frame


def test_a_ctrl_c_while_pickling_keeps_nothing_the_pickling_made():
    with pytest.raises(KeyboardInterrupt) as caught:
        pickle_shared({"small": list(range(10)), "big": _InterruptedWhilePickled()})
    kept = caught.value  # as IPython keeps the last exception
    gc.collect()
    assert made and made[-1]() is None and kept.__traceback__ is not None
