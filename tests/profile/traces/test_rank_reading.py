"""The per-rank pass (rank.py: a file's step windows, unions of busy, data-loading and communication time,
collectives and launch ids, reduced from its columns) on fixed traces, as recorded (recorded.py): synthetic and
random traces, GPU jobs of several schemas, CPU jobs, ROCm, MTIA and the H200's, read in typed slices, in slices
cut small, and event by event through the checked path; a real DDP job's ranks read both ways alike."""

from __future__ import annotations

import glob
import os

import pytest

from torchmagic.features.profile.traces import rank, sliced
from torchmagic.features.profile.traces.run import read_rank

from .record_summaries import rank_trace
from .recorded import RANKS_RECORDED, assert_rank_recorded, load, rank_fingerprint
from .summary_cases import CASES, DEVICE_TRACES
from .synthetic import event, write_trace

_FILES = {os.path.relpath(path, os.path.join(os.path.dirname(DEVICE_TRACES[0]), "..")) for path in DEVICE_TRACES}
_PARAMS = [pytest.param(name, marks=pytest.mark.trace_files) if name.startswith(("gpu/", "traces/")) else name
           for name in CASES]
_SMALL = ["synthetic_cases", "random_device_1", "traces/hta_cpu_gloo_rank-34.json.gz",
          "traces/hta_nccl_allreduce.json.gz", "traces/kineto_resnet50_workers0.pt.trace.json.gz"]


@pytest.fixture(scope="module")
def recorded() -> dict:
    return load(RANKS_RECORDED)


def _assert_as_recorded(name: str, recorded: dict, folder) -> None:
    trace = rank_trace(CASES[name], str(folder))
    assert (trace is None) == (name not in recorded), name
    if trace is not None:
        assert_rank_recorded(trace, recorded[name], name)


@pytest.mark.parametrize("name", _PARAMS)
def test_a_fixed_traces_reduction_is_as_recorded(name, recorded, tmp_path):
    _assert_as_recorded(name, recorded, tmp_path)


@pytest.mark.parametrize("name", _SMALL)
def test_in_small_slices_and_chunks_too(name, recorded, tmp_path, monkeypatch):
    monkeypatch.setattr(sliced, "SLICE_CHARS", 2000)  # a few events a batch: the batch's edges everywhere
    monkeypatch.setattr(rank, "_ROWS", 7)  # and the columns reduced a few rows at a time
    _assert_as_recorded(name, recorded, tmp_path)


@pytest.mark.parametrize("name", _SMALL[:4])
def test_read_event_by_event_through_the_checked_path(name, recorded, tmp_path, monkeypatch):
    monkeypatch.setattr(sliced, "decode_slice", lambda text: None)
    _assert_as_recorded(name, recorded, tmp_path)


def test_a_launch_or_kernel_written_again_in_a_row_is_kept_once(tmp_path, monkeypatch):
    """Kineto writes some device events twice; the pass keeps a run once where the same id and start come again
    right after (also across a batch's edge), and again where another came between."""
    events = [event("ProfilerStep#1", 0, 1000, cat="user_annotation"), event("aten::mm", 10, 50)]
    for i, (corr, ts) in enumerate([(5, 20), (5, 20), (5, 20), (6, 40), (5, 20), (6, 40), (6, 41), (0, 60)] * 30):
        events.append(event("cudaLaunchKernel", ts, 3, cat="cuda_runtime", correlation=corr))
        events.append(event("gemm", ts + 100, 20, cat="kernel", tid=7, correlation=corr))
        events.append(event("aten::add", ts + 1 + i, 1, cat="cpu_op"))
    path = str(write_trace(tmp_path / "twice.json", events))
    for chars, rows in ((sliced.SLICE_CHARS, rank._ROWS), (700, 4), (700, 5)):  # and their edges between the pairs
        monkeypatch.setattr(sliced, "SLICE_CHARS", chars)
        monkeypatch.setattr(rank, "_ROWS", rows)
        trace = read_rank(path)[0]
        # per 8 pairs: 5, 6, 5, 6, 6 (the 6 at 41 is another start), the (0, 60) pair has no id
        assert list(trace.kernel_corr) == [5, 6, 5, 6, 6] * 30 and list(trace.launch_corr) == [5, 6, 5, 6, 6] * 30
        assert list(trace.kernel_start[:5]) == [120.0, 140.0, 120.0, 140.0, 141.0]


def test_a_collective_written_twice_is_kept_once_and_its_bytes_counted(tmp_path):
    """gloo's range on its own thread, written twice (kept once), one still running when the profiler stopped,
    and record_param_comms' sizes: 1,024 floats and 8 halves."""
    events = [event("ProfilerStep#1", 0, 1000, cat="user_annotation"),
              event("gloo:all_reduce", 10, 50, cat="user_annotation", tid=9),
              event("gloo:all_reduce", 10, 50, cat="user_annotation", tid=9),
              event("gloo:broadcast", 900, 100, cat="user_annotation", tid=9, finished=False),
              event("record_param_comms", 5, 1, **{"Collective name": "all_reduce", "In msg nelems": 1024,
                                                  "dtype": "Float"}),
              event("record_param_comms", 6, 1, **{"Collective name": "allreduce", "In msg nelems": 8,
                                                  "dtype": "Half"}),
              event("c10d::allreduce_", 4, 8)]
    trace = read_rank(str(write_trace(tmp_path / "gloo.json", events)))[0]
    assert [(c.op, c.start, c.dur, c.finished) for c in trace.host_collectives] == [
        ("all_reduce", 10.0, 50.0, True), ("broadcast", 900.0, 100.0, False)]
    assert dict(trace.comm_bytes) == {"allreduce": 1024 * 4 + 8 * 2}
    assert trace.host_comm.total() == 150.0 and trace.host_busy.total() == 0.0  # c10d and its sizes: not compute
    assert trace.steps == {1: (0.0, 1000.0)} and trace.categories == {"user_annotation": 4, "cpu_op": 3}


def test_a_real_ddp_jobs_ranks(job_traces, monkeypatch):
    paths = sorted(glob.glob(os.path.join(job_traces, "*.json")))
    typed = [rank_fingerprint(read_rank(path)[0]) for path in paths]
    assert all(t["host_collectives"] and t["steps"] for t in typed)
    monkeypatch.setattr(sliced, "decode_slice", lambda text: None)
    for path, fingerprint in zip(paths, typed):
        assert rank_fingerprint(read_rank(path)[0]) == fingerprint, os.path.basename(path)
