"""A trace summarised in groups of consecutive steps, each group's events held alone, gives the summary
of the whole trace held at once: field by field, on real CPU and GPU traces (kineto's, HTA's, a real
DDP job's) and a generated one; and the folder the groups are spilled to never outlives the reading."""

import dataclasses
import functools
import glob
import os
import signal
import tempfile

import pytest
import torch

from torchmagic.core.interrupts import guarded
from torchmagic.features.profile.summary import TraceSummary
from torchmagic.features.profile.timeline import MAX_BARS_PER_LANE
from torchmagic.features.profile.traces import groups, ops
from torchmagic.features.profile.traces.rank import read_rank
from torchmagic.features.profile.traces.reader import TraceReader

from .summaries import assert_same
from .synthetic import gpu_steps, write_trace

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data")
CORPUS = sorted(glob.glob(os.path.join(DATA, "traces", "*.json.gz")) + glob.glob(os.path.join(DATA, "gpu", "*.json.gz")))


@pytest.fixture(autouse=True)
def uneven_steps_held(monkeypatch):
    """Small traces' first step is heavy (first calls): hold its group whatever its size here."""
    monkeypatch.setattr(ops, "HELD_EVENTS_CAP", 1000)


def _rank(path):
    return read_rank(TraceReader(path), path)


def _grouped(trace, steps_per_group):
    """The summary read in groups of ``steps_per_group`` steps, and how many groups."""
    limit = max(1, int(steps_per_group * trace.events / len(trace.steps)))
    count = groups.StepGroups(trace, groups.group_starts(trace, limit), None, None).count
    summary, _ = ops.operator_summary(trace, limit)
    return summary, count


PYTHON_OPS = ("python_op_us", "python_op_nodes", "python_op_sync", "python_gap_us")  # one row per op


def _python_ops(s: TraceSummary):
    """Each Python op's row, in call order per thread: the groups interleave the threads' lists."""
    return sorted(zip(*(list(getattr(s, name)) for name in PYTHON_OPS)))


def _assert_same(grouped: TraceSummary, whole: TraceSummary):
    assert_same(_python_ops(grouped), _python_ops(whole), "python ops")
    for f in dataclasses.fields(TraceSummary):
        a, b = getattr(grouped, f.name), getattr(whole, f.name)
        if f.name in PYTHON_OPS:
            continue
        if f.name in ("kernel_us", "launch_delay_us"):  # read as a distribution: in any order
            assert_same(sorted(a), sorted(b), f.name)
        elif f.name == "timeline":
            lanes = {s.lane for s in b}
            if not any(s.name == "(binned)" for s in b):
                assert sorted(a, key=repr) == sorted(b, key=repr)  # none binned: the same bars
            else:  # binned per group, then again: bounded all the same, every lane drawn
                assert {s.lane for s in a} == lanes and len(a) <= MAX_BARS_PER_LANE * len(lanes)
        else:
            assert_same(a, b, f.name)


@functools.lru_cache(maxsize=None)
def _read_whole(path: str):
    """A corpus trace read, and summarised at once (read only by the tests: shared by both group sizes)."""
    trace = _rank(path)
    return trace, ops.operator_summary(trace, trace.events)[0]


@pytest.mark.slow  # 1-6 s a trace: the fast lane keeps the generated traces below
@pytest.mark.parametrize("path", CORPUS, ids=os.path.basename)
@pytest.mark.parametrize("steps_per_group", [1, 2])
def test_a_real_trace_summarised_in_groups_of_steps_is_summarised_as_a_whole(path, steps_per_group):
    trace, whole = _read_whole(path)
    if len(trace.steps) <= steps_per_group:
        pytest.skip("one group")
    grouped, count = _grouped(trace, steps_per_group)
    assert count >= 2 and whole.steps == grouped.steps == len(trace.steps)
    _assert_same(grouped, whole)


@pytest.mark.slow
def test_a_real_ddp_jobs_trace_summarised_in_groups_is_summarised_as_a_whole(job_traces):
    for name in sorted(os.listdir(job_traces)):
        trace = _rank(os.path.join(job_traces, name))
        whole, _ = ops.operator_summary(trace, trace.events)
        grouped, count = _grouped(trace, 1)
        assert count == len(trace.steps) == 4
        _assert_same(grouped, whole)


def test_a_generated_gpu_trace_whose_host_runs_ahead_is_summarised_as_a_whole(tmp_path):
    """Kernels that run after the next group's start still count for the step that launched them."""
    path = write_trace(tmp_path / "ahead.json", gpu_steps(steps=6, late_us=9_000))
    trace = _rank(str(path))
    whole, _ = ops.operator_summary(trace, trace.events)
    grouped, count = _grouped(trace, 1)
    assert count == 6 and whole.device_busy_us > 0
    _assert_same(grouped, whole)


def _spill_folders():
    return glob.glob(os.path.join(tempfile.gettempdir(), "torchmagic-trace-*"))


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_spilled_groups_are_deleted_after_the_reading(private_tmp, monkeypatch):
    path = sorted(p for p in CORPUS if "kineto_resnet50_workers0" in p)[0]
    trace = _rank(path)
    written = []
    monkeypatch.setattr(groups, "BATCH", 10)  # every group goes to disk
    release = groups.StepGroups.release

    def spy(self):
        written.append(sorted(os.listdir(self.folder)) if self.folder else None)
        release(self)

    monkeypatch.setattr(groups.StepGroups, "release", spy)
    ops.operator_summary(trace, trace.events // 3)
    assert len(written[0]) >= 3 and _spill_folders() == []


@pytest.mark.parametrize("real_signal", [False, True])
def test_an_interrupt_mid_read_leaves_nothing_on_disk(private_tmp, monkeypatch, real_signal):
    path = sorted(p for p in CORPUS if "kineto_resnet50_workers0" in p)[0]
    trace = _rank(path)
    monkeypatch.setattr(groups, "BATCH", 10)
    put, calls = groups.StepGroups._put, []

    def interrupted(self, group, record):
        calls.append(group)
        if len(calls) == 500:  # groups are on disk by now
            assert _spill_folders() and os.listdir(self.folder)
            if real_signal:
                signal.raise_signal(signal.SIGINT)
            raise KeyboardInterrupt
        put(self, group, record)

    monkeypatch.setattr(groups.StepGroups, "_put", interrupted)
    with pytest.raises(KeyboardInterrupt), guarded():
        ops.operator_summary(trace, trace.events // 3)
    assert len(calls) == 500 and _spill_folders() == []


def _train(steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        with torch.profiler.record_function(f"ProfilerStep#{step}"):  # as prof.step() marks them
            loss = model(torch.randn(32, 64)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()


def test_a_cpu_trace_with_python_frames_and_memory_summarised_in_groups_is_summarised_as_a_whole(tmp_path):
    """The training loop's own Python frame spans every group: what runs under it keeps its frame."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_stack=True, profile_memory=True, record_shapes=True) as prof:
        _train(5)
    path = str(tmp_path / "cpu.json")
    prof.export_chrome_trace(path)
    trace = _rank(path)
    whole, _ = ops.operator_summary(trace, trace.events)
    assert whole.hot_lines and whole.memory_recorded and whole.steps == 5
    for steps_per_group in (1, 2):
        grouped, count = _grouped(trace, steps_per_group)
        assert count >= 3
        _assert_same(grouped, whole)


def test_a_ctrl_c_while_the_folder_is_deleted_is_raised_once_it_is_gone(private_tmp, monkeypatch):
    path = sorted(p for p in CORPUS if "kineto_resnet50_workers0" in p)[0]
    trace = _rank(path)
    monkeypatch.setattr(groups, "BATCH", 10)
    rmtree, left = groups.shutil.rmtree, []

    def interrupted(folder, **kwargs):
        signal.raise_signal(signal.SIGINT)  # held: the deleting goes on
        rmtree(folder, **kwargs)
        left.append(os.path.exists(folder))

    monkeypatch.setattr(groups.shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt), guarded():
        ops.operator_summary(trace, trace.events // 3)
    assert left == [False] and _spill_folders() == []
