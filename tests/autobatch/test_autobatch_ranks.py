"""%%autobatch --ranks N on real processes (gloo on CPU): every rank runs each trial, a size fits
only if it fits on all, a rank that runs out of memory part-way (the others then wait in DDP's
all-reduce for ever) has every rank started again, and nothing is left behind."""

import os
import re
import signal
import tempfile
import threading
import time

import pytest

from torchmagic.features.autobatch.footprint import FOOTPRINT_RUNS, agree
from torchmagic.features.autobatch.search import TRIAL_STEPS

from ..conftest import run
from ..processes import assert_left_as_it_was, process_state, record_rank_starts

DDP_SETUP = '''import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(nn.Sequential(nn.Linear(width, 1024), nn.ReLU(), nn.Linear(1024, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
'''


def test_every_rank_runs_each_trial_and_the_answer_is_per_rank_and_global(shell):
    shell.user_ns["width"] = 256
    before = process_state()
    cell = (f"%%autobatch --ranks 2 --share width --max 2048 --target-batch 6000 --throughput -o found step\n"
            f"{DDP_SETUP}"
            "def step(batch_size):\n"
            "    model(torch.randn(batch_size, width)).sum().backward()\n"
            "    optimizer.step()\n    optimizer.zero_grad()\n"
            "print('built on rank', dist.get_rank())\n")
    result, captured = run(shell, cell)
    assert result.success, (result.error_in_exec, captured.stderr[-2000:])
    assert "[rank 0] built on rank 0" in captured.stdout and "[rank 1] built on rank 1" in captured.stdout
    found = shell.user_ns["found"]
    assert found.ranks == 2 and found.batch_size == 2048 and found.global_batch_size == 4096
    assert found.reason == "the largest allowed size (2048) fits"
    real = [t for t in found.trials if t.ran]
    assert real and all(len(t.rank_peaks_bytes) == 2 and t.peak_bytes == max(t.rank_peaks_bytes) for t in real)
    # the default budget: half the RAM available, shared by the two ranks on this machine
    assert "shared by the 2 ranks on this machine" in found.budget_source
    # a global target of 6000 on 2 ranks: 3000 per rank, in 2 steps of 1500 at most 2048
    assert (found.accumulation_steps, found.micro_batch) == (2, 1500)
    # samples/s over both ranks at each size up to the answer
    assert [p.batch_size for p in found.throughput] == [64, 128, 256, 512, 1024, 2048]
    assert all(p.samples_per_s == pytest.approx(2 * p.batch_size / p.seconds_per_step) for p in found.throughput)
    text = found.to_text()
    assert text.startswith("Largest batch size that fits: 2048 per rank × 2 ranks = global batch 4096 (ran on every "
                           "rank, peaked at ")
    assert "ranks' peaks" in text and "Batch 6000: 2 accumulation steps of 1500 on each of 2 ranks" in text
    assert "shared with each rank (pickled" in found.notes[0] and "width" in found.notes[0]
    assert found.to_dict()["global_batch_size"] == 4096
    assert_left_as_it_was(before)


@pytest.mark.slow
def test_one_rank_running_out_part_way_restarts_every_rank_instead_of_hanging(shell):
    """Rank 0 runs out in the forward pass above 300 samples; rank 1 goes on into backward and
    waits in the gradients' all-reduce for a rank that will never join it."""
    before = process_state()
    shell.user_ns["width"] = 64
    cell = ("%%autobatch --ranks 2 --share width --multiple-of 32 --max 512 -o found step\n"
            f"{DDP_SETUP}"
            "def step(batch_size):\n"
            "    if dist.get_rank() == 0 and batch_size > 300:\n"
            "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
            "    model(torch.randn(batch_size, width)).sum().backward()\n"
            "    optimizer.step()\n    optimizer.zero_grad()\n")
    started = time.perf_counter()
    result, captured = run(shell, cell)
    assert result.success, (result.error_in_exec, captured.stderr[-2000:])
    # each failed trial cost a restart, not gloo's 30-minute timeout: ~600 s lets a loaded machine restart
    # 2 ranks after each failed trial, and one timeout (1800 s) still fails
    assert time.perf_counter() - started < 600
    found = shell.user_ns["found"]
    assert found.batch_size == 288 and found.global_batch_size == 576
    failed = [t for t in found.trials if not t.ran]
    assert failed and all(t.error.startswith("rank 0: OutOfMemoryError: CUDA out of memory") for t in failed)
    # started again before each trial that followed a failed one (not after the last trial)
    assert found.restarts == sum(not t.ran for t in found.trials[:-1]) >= 1
    assert f"every rank was started again {found.restarts} time(s)" in found.notes[0]
    assert_left_as_it_was(before)


def test_a_rank_that_runs_out_at_the_smallest_size_gives_no_answer_and_says_which(shell):
    before = process_state()
    cell = ("%%autobatch --ranks 2 -o found step\nimport torch, torch.distributed as dist\n"
            "def step(n):\n    if dist.get_rank() == 1:\n        raise torch.OutOfMemoryError('CUDA out of memory.')\n")
    result, captured = run(shell, cell)
    assert result.success, captured.stderr[-2000:]
    found = shell.user_ns["found"]
    assert found.batch_size is None and found.global_batch_size is None
    assert found.reason == "the smallest size (1) runs out of memory on rank 1"
    assert found.headline() == "No batch size fits: the smallest size (1) runs out of memory on rank 1."
    assert_left_as_it_was(before)


def test_a_step_that_fails_on_one_rank_shows_its_frames_and_stops_the_others(shell):
    before = process_state()
    cell = ("%%autobatch --ranks 2 -- run(BS)\nimport torch.distributed as dist\n"
            "def run(n):\n    if dist.get_rank() == 1 and n > 1:\n        raise ValueError(f'no batch of {n}')\n")
    result, captured = run(shell, cell)
    shown = captured.stdout + captured.stderr
    assert "[rank 1] ValueError: no batch of" in shown and "[rank 1]     raise ValueError(f'no batch of {n}')" in shown
    assert "worker.py" not in shown and "torchmagic/" not in shown
    assert shown.strip().splitlines()[-1].startswith("UsageError: %%autobatch: rank 1 failed: ValueError: no batch of")
    assert_left_as_it_was(before)


@pytest.mark.parametrize("line, message", [
    ("%autobatch --ranks 2 step", "%autobatch: --ranks N needs the cell form: %%autobatch --ranks N step"),
    ("%autobatch --fresh step", "%autobatch: --fresh needs the cell form: %%autobatch --fresh step"),
    ("%autobatch --share x step", "%autobatch: --backend and --share go with --ranks N (the cell form)"),
    ("%%autobatch step\nx = 2", "%%autobatch: the cell form runs the cell on --ranks N processes"),
    ("%%autobatch --ranks 2\nx = 2", "%%autobatch: name the step the cell defines"),
    ("%%autobatch --ranks 2 step -- f(BS)\nx = 2", "name the step the cell defines (%%autobatch --ranks N step) or "
                                                  "give `-- EXPR` using BS, not both"),
    ("%%autobatch --ranks 2 -- f(8)\nx = 2", "%%autobatch: the expression after -- must use BS"),
    ("%%autobatch --ranks 2 --device cpu step\nx = 2", "--device cannot go with --ranks"),
    ("%%autobatch --ranks 0 step\nx = 2", "--ranks must be at least 1, got 0"),
    ("%%autobatch --ranks 2 --backend nccl step\nx = 2", "--backend nccl needs a GPU per rank: 2 ranks, 0 GPU(s)"),
    ("%%autobatch --ranks 2 --share missing step\nx = 2", "--share 'missing': not defined in the notebook"),
    ("%%autobatch --ranks 2 --share local_fn step\nx = 2", "--share local_fn: uses local_fn, defined in the notebook"),
    ("%%autobatch --ranks 2 --budget lots step\nx = 2", "%%autobatch: --budget takes bytes"),
    ("%%autobatch --ranks 2 step\nx = (", "%%autobatch: the code has a syntax error (above); nothing ran"),
    ("%%autobatch --ranks 2 -- f(BS\nx = 2", "%%autobatch: the expression after -- is not Python: '(' was never closed"),
])
def test_bad_settings_are_one_line_before_any_rank_starts(shell, line, message, monkeypatch):
    shell.run_cell("def local_fn():\n    pass\nx = 1")
    before = process_state()
    starts = record_rank_starts(monkeypatch)
    started = time.perf_counter()
    _, captured = run(shell, line)
    shown = (captured.stdout + captured.stderr).strip().splitlines()[-1]
    assert shown.startswith("UsageError: %") and message in shown, shown
    assert starts == [] and shell.user_ns["x"] == 1  # no rank, nor the cell, ran
    # a backstop against slow work before the refusal, which takes milliseconds: 10 s passes a loaded machine
    assert time.perf_counter() - started < 10
    assert_left_as_it_was(before)


@pytest.mark.slow  # 4-11 s: the fast lane (-m "not slow") stays under 5 minutes
def test_fresh_reads_each_trial_in_processes_started_for_it_and_counts_their_spread(shell):
    """--fresh: no rank is started again after running out, yet a process is started for every read,
    and the reads of one size in fresh processes (which vary: glibc's heap, the libraries' first use)
    count what one more process could take."""
    before = process_state()
    cell = ("%%autobatch --fresh --min 64 --max 64 --budget 256MiB -o found step\n"
            "import os, torch, torch.nn as nn\n"
            "model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))\n"
            "optimizer = torch.optim.AdamW(model.parameters())\n"
            "steps = []\n"
            "def step(batch_size):\n"
            "    steps.append(batch_size)\n"
            "    print('pid', os.getpid(), 'step', len(steps))\n"
            "    model(torch.randn(batch_size, 256)).sum().backward()\n"
            "    optimizer.step()\n    optimizer.zero_grad()\n")
    result, captured = run(shell, cell)
    assert result.success, (result.error_in_exec, captured.stderr[-2000:])
    found = shell.user_ns["found"]
    [trial] = found.trials
    reads = trial.footprint_reads
    assert found.batch_size == 64 and found.restarts == len(reads) - 1 and 2 <= len(reads) <= FOOTPRINT_RUNS[1]
    # each process read its own first steps: one read, then torch's allocations in a second run
    pids = re.findall(r"pid (\d+) step (\d+)", captured.stdout)
    assert len({pid for pid, _ in pids}) == len(reads)
    assert all(sorted(int(n) for p, n in pids if p == pid) == list(range(1, 2 * TRIAL_STEPS + 1))
               for pid, _ in pids)
    assert trial.peak_bytes >= max(max(reads), trial.allocated_bytes)
    assert f"--fresh: each read of a trial was of the first {TRIAL_STEPS} steps" in found.notes[0]
    text = found.to_text()
    assert text.startswith("Largest batch size that fits: 64 (ran, peaked at ") and f"({len(reads)} processes)" in text
    # the note on reads that differ is said of processes, and only where they differed
    assert ("Resident memory differed from process to process" in text) == (trial.peak_bytes > max(reads)
                                                                             or not agree(reads))
    assert_left_as_it_was(before)


def test_a_cell_that_does_not_define_the_step_is_one_line(shell):
    _, captured = run(shell, "%%autobatch --ranks 2 train_step\nx = 2\n")
    assert (captured.stdout + captured.stderr).strip().splitlines()[-1] == (
        "UsageError: %%autobatch: the cell did not define 'train_step': it should define train_step(batch_size), "
        "which builds a batch and runs one step")


@pytest.mark.slow
@pytest.mark.parametrize("when", ["while the ranks start", "during the trials"])
def test_an_interrupt_stops_every_rank_and_shows_the_trials_so_far(shell, when, tmp_path, tmp_path_factory,
                                                                   monkeypatch):
    before = process_state()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shell.user_ns["marker"] = str(tmp_path_factory.mktemp("steps") / "ran")
    cell = ("%%autobatch --ranks 2 --max 64 --share marker step\nimport time\n"
            "def step(batch_size):\n    open(marker, 'a').write('.')\n    time.sleep(0.5)\n")
    stop = threading.Event()

    def interrupt():
        if when == "during the trials":  # a trial done on both ranks, however loaded the machine: its
            # profiled run and the runs that read the footprint, TRIAL_STEPS steps each
            calls = 2 * (1 + FOOTPRINT_RUNS[0]) * TRIAL_STEPS
            while not stop.is_set() and (not os.path.exists(shell.user_ns["marker"])
                                         or len(open(shell.user_ns["marker"]).read()) < calls + 2):
                time.sleep(0.05)
        if not stop.wait(0.3):
            os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt)
    timer.start()
    try:
        result, captured = run(shell, cell)
    finally:
        stop.set()
        timer.join()
    shown = captured.stdout + captured.stderr
    assert isinstance(result.error_in_exec, KeyboardInterrupt), shown[-2000:]
    assert "torchmagic/" not in shown and "worker.py" not in shown, shown[-2000:]
    if when == "during the trials":
        assert re.search(r"interrupted after \d+ trials, before the search ended: no answer", shown), shown[-2000:]
    assert os.listdir(tmp_path) == []
    assert_left_as_it_was(before)


@pytest.mark.slow
def test_the_python_twin_takes_the_code_and_a_per_rank_budget(capsys):
    import torchmagic

    before = process_state()
    code = DDP_SETUP + "def train_step(n):\n    model(torch.randn(n, width)).sum().backward()\n"
    found = torchmagic.autobatch_ranks(code, 2, step="train_step", share={"width": 128}, budget=64 * 2**20,
                                       max=1 << 20, multiple_of=8)
    assert found.ranks == 2 and found.label == "train_step" and found.budget_source == "as given, for each rank"
    assert found.batch_size is not None and found.batch_size % 8 == 0 and found.answer_trial.peak_bytes <= found.limit_bytes
    assert found.reason.startswith(f"{found.batch_size} fits and ")  # the limit, not the largest size, decided it
    with pytest.raises(ValueError, match="share"):
        torchmagic.autobatch_ranks(code, 2, share={"width": lambda: 1})
    assert_left_as_it_was(before)
