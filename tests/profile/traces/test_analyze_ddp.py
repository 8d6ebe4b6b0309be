"""torchmagic.analyze on the traces of a real job: 2 gloo ranks under torch.distributed.run, rank 1
with a slow input pipeline.  Rank 1 is named the straggler, rank 0 waits far longer, and bad
input gets one line naming the file."""

import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import pytest

import torchmagic
from torchmagic.features.profile.traces.reader import TraceFileError

from ...conftest import run
from ...processes import child_pids, record_rank_starts

@pytest.mark.slow
def test_the_slow_input_rank_is_the_straggler_and_the_other_waits(job_traces):
    r = torchmagic.analyze(job_traces)
    assert [x.rank for x in r.ranks] == [0, 1] and r.world_size == 2 and r.backend == "gloo"
    assert all(x.steps == 4 for x in r.ranks)
    assert r.straggler == 1 and r.straggler_phase == "data loading"
    fast, slow = r.rank(0), r.rank(1)
    # rank 1 loads 32 samples x 2 ms = 64 ms a step; rank 0 waits for it in the gradient all-reduce.  Rank
    # 0's loading (~0.3 ms) stays under 12.8 ms unless its 4 steps lose ~50 ms to preemption; swapped or
    # missed loading (64 ms on rank 0, or 0 on rank 1) still fails
    assert slow.dataloader_s > 0.064 > 5 * fast.dataloader_s
    # per-step medians: rank 1 waits only in a step where rank 0 lost > 64 ms, and the median ignores one
    # such step; waits swapped between the ranks or read as transfer still fail
    fast_wait, slow_wait = (statistics.median(x.step_waits_s.values()) for x in (fast, slow))
    assert fast.wait_s > 0.032 and fast_wait > 0.032 and fast_wait > 5 * slow_wait
    assert fast.comm_s > 2 * slow.comm_s
    assert fast.exposed_comm_s > fast.wait_s * 0.9
    for x in r.ranks:  # seconds per step, each part within the step
        assert 0 < x.step_s < 1
        assert x.compute_s + x.dataloader_s + x.idle_s <= x.step_s * 1.01
        assert x.wait_s + x.transfer_s <= x.comm_s * 1.01
        assert set(x.collectives) == {"all_reduce"} and x.collectives["all_reduce"]["calls"] >= 3
    finding = r.finding("straggler_dataloader")
    assert finding is not None and finding.verify == "%loadertune loader"
    assert r.findings[0] is finding
    text = r.to_text()
    assert text.startswith("Straggler: rank 1. Rank 1 spends") and "data loading" in text.splitlines()[0]
    assert "1  ← straggler" in text
    assert "<img" in r.to_html() and "Straggler: rank 1" in r.to_html()
    assert json.loads(r.to_json())["straggler"] == 1
    assert [lane.rank for lane in r.lanes] == [0, 1] and r.lane_step is not None
    assert repr(r).startswith("<TraceAnalysis: Straggler: rank 1.")


def test_one_file_gzipped_a_list_of_files_and_ranks_from_file_names(job_traces, tmp_path):
    files = sorted(os.path.join(job_traces, f) for f in os.listdir(job_traces))
    one = torchmagic.analyze(files[0])
    assert [x.rank for x in one.ranks] == [0] and one.straggler is None
    assert any("waiting cannot be told from transfer" in note for note in one.notes)
    assert one.headline().startswith("1 rank:")
    listed = torchmagic.analyze(files)
    assert listed.straggler == 1
    for i, path in enumerate(files):  # no distributedInfo: ranks from "rank<N>" in the names
        data = json.load(open(path))
        del data["distributedInfo"]
        with gzip.open(tmp_path / f"worker_rank{i}.pt.trace.json.gz", "wt") as f:
            json.dump(data, f)
    named = torchmagic.analyze(tmp_path)
    assert [x.rank for x in named.ranks] == [0, 1] and named.straggler == 1 and named.world_size == 2


def _one_line(source) -> str:
    with pytest.raises(TraceFileError) as caught:
        torchmagic.analyze(source)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_bad_input_is_one_line_naming_the_file(job_traces, tmp_path):
    assert _one_line(tmp_path / "missing") == f"{tmp_path / 'missing'}: does not exist"
    assert _one_line(tmp_path) == f"{tmp_path}: holds no trace files (*.json, *.json.gz)"
    (tmp_path / "other.json").write_text('{"name": "not a trace", "values": [1, 2]}')
    assert _one_line(tmp_path / "other.json").endswith("other.json: is JSON but not a trace: it has no traceEvents")
    (tmp_path / "notes.json").write_text("these are notes")
    assert "notes.json: is not a trace: expected '{' or '['" in _one_line(tmp_path / "notes.json")
    source = sorted(os.listdir(job_traces))[0]
    text = open(os.path.join(job_traces, source)).read()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    assert _one_line(tmp_path / "cut.json").endswith("cut.json: ends in the middle of an event (truncated?)")
    (tmp_path / "broken.json.gz").write_bytes(gzip.compress(text.encode())[:2000])
    assert "broken.json.gz: " in _one_line(tmp_path / "broken.json.gz")
    (tmp_path / "empty.json").write_text('{"traceEvents": []}')
    assert _one_line(tmp_path / "empty.json").endswith("empty.json: has no timed events (\"ph\": \"X\"): nothing to analyse")


def test_traces_of_different_jobs_or_two_of_one_rank_are_refused(job_traces, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(job_traces, mixed)
    path = os.path.join(mixed, sorted(os.listdir(mixed))[1])
    data = json.load(open(path))
    data["distributedInfo"]["world_size"] = 4
    json.dump(data, open(path, "w"))
    assert "was given traces of jobs of different sizes: world sizes 2 (" in _one_line(mixed)
    twice = tmp_path / "twice"
    shutil.copytree(job_traces, twice)
    first = sorted(os.listdir(twice))[0]
    shutil.copy(os.path.join(twice, first), os.path.join(twice, "again_" + first))
    assert "is a second trace of rank 0" in _one_line(twice)


def test_the_load_magic_shows_the_report_and_keeps_it(job_traces, shell):
    result, captured = run(shell, f"%torchprofile -q -o analysis --load '{job_traces}'")
    assert result.success and captured.stdout == ""
    assert shell.user_ns["analysis"].straggler == 1
    result, captured = run(shell, f"%torchprofile --load {job_traces}")
    assert result.success and "Straggler: rank 1." in captured.stdout
    files = sorted(os.path.join(job_traces, f) for f in os.listdir(job_traces))
    result, _ = run(shell, f"r = %torchprofile --load {files[0]},{files[1]}")
    assert shell.user_ns["r"].straggler == 1
    result, captured = run(shell, "%torchprofile --load /no/such/dir")
    assert (captured.stdout + captured.stderr).strip() == "UsageError: %torchprofile --load: /no/such/dir: does not exist"


DDP_CELL = '''%%torchprofile --ranks 2 --warmup 1 --steps 3 --share sample_wait -o ranked
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 20
    def __getitem__(self, i):
        if dist.get_rank() == 1:
            time.sleep(sample_wait)
        return torch.randn(64), torch.randn(8)

batches = iter(torch.utils.data.DataLoader(Samples(), batch_size=32))
for _ in range(5):
    x, y = next(batches)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    prof.step()
print("done on rank", dist.get_rank())
'''


@pytest.mark.slow  # 4-11 s: the fast lane (-m "not slow") stays under 5 minutes
def test_a_ddp_cell_on_two_ranks_finds_the_straggler_and_leaves_no_process(shell):
    shell.user_ns["sample_wait"] = 0.002  # 64 ms a step on rank 1 (see the test above)
    before = child_pids()
    result, captured = run(shell, DDP_CELL)
    assert result.success, result.error_in_exec
    assert "[rank 0] done on rank 0" in captured.stdout and "[rank 1] done on rank 1" in captured.stdout
    assert "USDT" not in captured.stdout + captured.stderr
    ranked = shell.user_ns["ranked"]
    assert [x.rank for x in ranked.ranks] == [0, 1] and all(x.steps == 3 for x in ranked.ranks)
    waits = [statistics.median(ranked.rank(n).step_waits_s.values()) for n in (0, 1)]
    assert ranked.straggler == 1 and waits[0] > 0.032 and waits[0] > 5 * waits[1]
    assert ranked.notes[0].startswith("ran on 2 rank(s) with gloo") and "sample_wait" in ranked.notes[0]
    assert child_pids() <= before


@pytest.mark.slow  # 4-11 s: the fast lane (-m "not slow") stays under 5 minutes
def test_a_failing_rank_stops_the_others_and_shows_its_traceback(shell):
    before = child_pids()
    cell = ("%%torchprofile --ranks 2\nimport time, torch.distributed as dist\n"
            "if dist.get_rank() == 1:\n    1 / 0\ntime.sleep(600)\n")
    started = time.perf_counter()
    result, captured = run(shell, cell)
    # rank 0 was stopped, not waited for: 2-11 s here, so a 10x slower machine passes, and waiting out
    # rank 0's 600 s sleep does not
    assert time.perf_counter() - started < 300
    shown = captured.stdout + captured.stderr
    assert "[rank 1] ZeroDivisionError: division by zero" in shown
    assert "[rank 1]     1 / 0" in shown and "worker.py" not in shown
    assert shown.strip().endswith("UsageError: %%torchprofile: rank 1 failed: ZeroDivisionError: division by zero "
                                  "(its output is above); the other ranks were stopped")
    assert child_pids() <= before


@pytest.mark.slow
def test_too_few_steps_and_a_kept_trace_directory(shell, tmp_path):
    cell = "%%torchprofile --ranks 2 --warmup 3 --steps 2\nfor _ in range(2):\n    prof.step()\n"
    _, captured = run(shell, cell)
    assert (captured.stdout + captured.stderr).strip().splitlines()[-1] == (
        "UsageError: %%torchprofile: --warmup and --steps: the cell called prof.step() 2 time(s): too few to "
        "reach a profiled step (after 3 warm-up step(s))")
    (tmp_path / "rank0.old.pt.trace.json").write_text("left from another run")
    result, _ = run(shell, f"%%torchprofile -q -o kept --ranks 2 --trace {tmp_path}\nimport torch\n"
                           "torch.ones(8).sum()\n")
    assert result.success and [x.rank for x in shell.user_ns["kept"].ranks] == [0, 1]
    assert {"rank0.pt.trace.json", "rank1.pt.trace.json"} <= set(os.listdir(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.3, 2.0, 6.0])  # starting the ranks, importing torch, in the cell
def test_an_interrupt_stops_every_rank_and_leaves_nothing_behind(shell, delay, tmp_path, monkeypatch):
    import glob
    import signal
    import tempfile
    import threading

    import psutil

    before = child_pids()
    threads = threading.active_count()
    fds = psutil.Process().num_fds()
    handler = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this run's working directory goes here
    timer = threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        result, captured = run(shell, "%%torchprofile --ranks 2\nimport time\ntime.sleep(120)\n")
    finally:
        timer.cancel()
    shown = captured.stdout + captured.stderr
    assert isinstance(result.error_in_exec, KeyboardInterrupt), (result.error_in_exec, shown[-2000:])
    assert "interrupted: every rank was stopped" in captured.stdout, shown[-2000:]
    assert "torchmagic/" not in shown, shown[-2000:]
    assert child_pids() <= before, (child_pids(), before)
    assert threading.active_count() == threads, threading.enumerate()
    assert psutil.Process().num_fds() <= fds, (psutil.Process().num_fds(), fds)
    assert signal.getsignal(signal.SIGINT) is handler
    assert glob.glob(os.path.join(tmp_path, "torchmagic-ranks-*")) == []


@pytest.mark.parametrize("line, message", [
    ("--ranks 0", "--ranks must be at least 1, got 0"),
    ("--ranks 2 --backend mpi", "--backend must be gloo or nccl, got 'mpi'"),
    ("--ranks 2 --backend nccl", "--backend nccl needs a GPU per rank: 2 ranks, 0 GPU(s) here"),
    ("--ranks 100", "--ranks 100 is more than 4x the"),
    ("--ranks 2 --share nothing_here", "--share 'nothing_here': not defined in the notebook"),
    ("--ranks 2 --share local_fn", "--share local_fn: uses local_fn, defined in the notebook"),
    ("--ranks 2 --memory", "--memory cannot go with --ranks"),
    ("--ranks 2 --capture-budget 1GiB", "--capture-budget cannot go with --ranks"),
    ("--share x", "--backend, --share, --nnodes, --node-rank and --master go with --ranks N"),
])
def test_bad_rank_settings_are_one_line_before_anything_starts(shell, line, message, monkeypatch):
    shell.run_cell("def local_fn():\n    pass\nx = 1")
    before = child_pids()
    starts = record_rank_starts(monkeypatch)
    started = time.perf_counter()
    _, captured = run(shell, f"%%torchprofile {line}\nx = 2\n")
    shown = (captured.stdout + captured.stderr).strip()
    assert shown.startswith("UsageError: %%torchprofile: ") and message in shown and "\n" not in shown
    assert starts == [] and child_pids() <= before and shell.user_ns["x"] == 1  # no rank, nor the cell, ran
    # a backstop against slow work before the refusal, which takes milliseconds: 10 s passes a loaded machine
    assert time.perf_counter() - started < 10


def test_a_rank_that_cannot_start_stops_the_ones_that_did(monkeypatch):
    import subprocess as sp

    from torchmagic.core.ranks import processes
    from torchmagic.features.profile.traces import launch

    started = []
    real = sp.Popen

    def second_fails(*args, **kwargs):
        if started:
            raise OSError("no more processes")
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(processes.subprocess, "Popen", second_fails)
    with pytest.raises(OSError):
        launch.run_ranks("import time\ntime.sleep(60)\n", {}, launch.RanksOptions(ranks=2))
    assert started and started[0].poll() is not None


@pytest.mark.slow
def test_the_python_twin_of_ranks_takes_the_code_and_the_shared_values(tmp_path, capsys):
    import torchmagic

    code = ("import torch, torch.distributed as dist\nfor _ in range(3):\n"
            "    t = torch.ones(size) * (dist.get_rank() + 1)\n    dist.all_reduce(t)\n    prof.step()\n"
            "print('sum', t[0].item())\n")
    r = torchmagic.profile_ranks(code, 2, share={"size": 1024}, steps=2, warmup=1, trace=str(tmp_path))
    assert [x.rank for x in r.ranks] == [0, 1] and all(x.steps == 2 for x in r.ranks)
    assert all(x.collectives["all_reduce"]["calls"] == 2 for x in r.ranks)
    assert "shared with each rank" in r.notes[0] and "size" in r.notes[0]
    out = capsys.readouterr().out
    assert "[rank 0] sum 3.0" in out and "[rank 1] sum 3.0" in out
    assert {"rank0.pt.trace.json", "rank1.pt.trace.json"} <= set(os.listdir(tmp_path))
    with pytest.raises(torchmagic.RankFailed, match=r"rank [01] failed: NameError: name 'size' is not defined"):
        torchmagic.profile_ranks(code, 2)


@pytest.mark.slow
def test_a_job_over_two_nodes_each_running_its_ranks(shell, tmp_path):
    """Two machines, played here by the notebook (node 0) and a script (node 1), one rank each:
    node 0's rank 0 listens at --master and node 1's rank joins it, as torchrun's nodes do."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import torch, torch.distributed as dist\nfor _ in range(3):\n"
            "    t = torch.ones(256) * (dist.get_rank() + 1)\n    dist.all_reduce(t)\n    prof.step()\n"
            "print('rank', dist.get_rank(), 'of', dist.get_world_size(), 'sum', t[0].item())\n")
    node1 = subprocess.Popen([sys.executable, "-c", "import sys, torchmagic\n"
                              "torchmagic.profile_ranks(sys.argv[1], 1, steps=2, warmup=1, trace=sys.argv[2], "
                              "nnodes=2, node_rank=1, master=sys.argv[3])", code, str(tmp_path),
                              f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        result, captured = run(shell, f"%%torchprofile --ranks 1 --warmup 1 --steps 2 --nnodes 2 --node-rank 0 "
                                      f"--master 127.0.0.1:{port} --trace {tmp_path} -o node0\n{code}")
        out, err = node1.communicate(timeout=120)
    finally:
        node1.kill()
    assert result.success, captured.stderr[-2000:]
    assert "[rank 0] rank 0 of 2 sum 3.0" in captured.stdout and "[rank 1] rank 1 of 2 sum 3.0" in out, err[-2000:]
    node0 = shell.user_ns["node0"]
    assert [x.rank for x in node0.ranks] == [0] and node0.world_size == 2
    assert "of node 0 (ranks 0 to 0 of 2" in node0.notes[0]
    both = torchmagic.analyze(tmp_path)  # the shared directory: every rank's trace
    assert [x.rank for x in both.ranks] == [0, 1]
    assert all(x.collectives["all_reduce"]["calls"] == 2 for x in both.ranks)


@pytest.mark.parametrize("line, message", [
    ("--ranks 1 --nnodes 2", "--master is needed with nnodes > 1: HOST:PORT of node 0"),
    ("--ranks 1 --nnodes 2 --node-rank 2 --master h:1", "--node-rank must be from 0 to nnodes - 1 (1), got 2"),
    ("--ranks 1 --nnodes 2 --master node0", "--master must be HOST:PORT (a port from 1 to 65535), got 'node0'"),
    ("--nnodes 2", "--nnodes, --node-rank and --master go with --ranks N"),
])
def test_bad_node_settings_are_one_line(shell, line, message):
    _, captured = run(shell, f"%%torchprofile {line}\nx = 2\n")
    shown = (captured.stdout + captured.stderr).strip()
    assert shown.startswith("UsageError: %%torchprofile: ") and message in shown and "\n" not in shown
