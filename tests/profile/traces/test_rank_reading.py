"""The per-rank pass over typed slices (rank._Reading.records: its own loop over the records, a record that is not
plain read from its dict), and over the columns the operator pass reads alongside (rank._Reading.columns: tensors
for most records), against the checked path reading every event from its dict: the same RankTrace, field by field,
on every real trace under tests/data (GPU jobs of several schemas, CPU jobs, ROCm, MTIA), a real DDP job's ranks,
and slices cut small."""

from __future__ import annotations

import glob
import os

import pytest

from torchmagic.features.profile.traces import rank, sliced
from torchmagic.features.profile.traces.ops import AlongsideReading
from torchmagic.features.profile.traces.rank import RankTrace, read_rank
from torchmagic.features.profile.traces.sliced import SlicedTraceReader

from .synthetic import event, write_trace

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "traces")
TRACES = sorted(glob.glob(os.path.join(DATA, "*.json.gz")) + glob.glob(os.path.join(DATA, "*", "*.json.gz")))


class _CheckedOnly(SlicedTraceReader):
    """The checked path alone: each event its own batch, read from its dict."""

    def _array(self):
        for one in self._events():
            yield sliced.Batch(self.index, None, None, [one])


def _fields(trace: RankTrace) -> dict:
    """Everything a RankTrace holds, its interval sets as their merged unions, its dicts with their order."""
    fields = {}
    for name, value in vars(trace).items():
        if hasattr(value, "merged"):
            value = tuple(list(part) for part in value.merged())
        elif isinstance(value, dict):
            value = list(value.items())
        elif hasattr(value, "tolist"):
            value = value.tolist()
        fields[name] = value
    return fields


def _assert_same(path: str) -> None:
    checked = _fields(read_rank(_CheckedOnly(path), path))
    typed = _fields(read_rank(SlicedTraceReader(path), path))
    alongside = AlongsideReading(path)
    columns = _fields(read_rank(SlicedTraceReader(path), path, alongside))
    for way, read in (("the typed loop", typed), ("over the columns", columns)):
        assert read.keys() == checked.keys()
        for name in read:
            assert read[name] == checked[name], f"{os.path.basename(path)}, {way}: {name} differs"


@pytest.mark.trace_files
@pytest.mark.parametrize("path", TRACES, ids=[os.path.basename(p) for p in TRACES])
def test_every_real_trace_reads_as_the_checked_path_reads_it(path):
    _assert_same(path)


@pytest.mark.parametrize("path", TRACES[:4], ids=[os.path.basename(p) for p in TRACES[:4]])
def test_in_small_slices_too(path, monkeypatch):
    monkeypatch.setattr(sliced, "SLICE_CHARS", 2000)  # a few events a batch: the batch's edges everywhere
    _assert_same(path)


def test_the_columns_read_most_batches(monkeypatch):
    """The path over columns is taken (a batch with a name the typed path reads from its dict is not: a kernel's
    long templated name, cut), so that the comparisons above compare it."""
    seen = []
    reading = rank._Reading.columns
    monkeypatch.setattr(rank._Reading, "columns", lambda self, *args: seen.append(reading(self, *args)) or seen[-1])
    for path in TRACES:
        read_rank(SlicedTraceReader(path), path, AlongsideReading(path))
    assert len(seen) > 500 and sum(seen) > 0.9 * len(seen)


def test_a_launch_or_kernel_written_again_in_a_row_is_kept_once(tmp_path, monkeypatch):
    """Kineto writes some device events twice; the pass keeps a run once where the same id and start come again
    right after (also across a batch's edge), and again where another came between."""
    events = [event("ProfilerStep#1", 0, 1000, cat="user_annotation"), event("aten::mm", 10, 50)]
    for i, (corr, ts) in enumerate([(5, 20), (5, 20), (5, 20), (6, 40), (5, 20), (6, 40), (6, 41), (0, 60)] * 30):
        events.append(event("cudaLaunchKernel", ts, 3, cat="cuda_runtime", correlation=corr))
        events.append(event("gemm", ts + 100, 20, cat="kernel", tid=7, correlation=corr))
        events.append(event("aten::add", ts + 1 + i, 1, cat="cpu_op"))
    path = str(write_trace(tmp_path / "twice.json", events))
    for chars in (sliced.SLICE_CHARS, 700):  # whole, and batches of a few events: their edges between the pairs
        monkeypatch.setattr(sliced, "SLICE_CHARS", chars)
        _assert_same(path)
    trace = read_rank(SlicedTraceReader(path), path, AlongsideReading(path))
    assert list(trace.kernel_corr[:5]) == [5, 6, 5, 6, 6]  # (the repeat of the 8-pair pattern starts again with 5)


def test_a_real_ddp_jobs_ranks(job_traces):
    for path in sorted(glob.glob(os.path.join(job_traces, "*.json"))):
        _assert_same(path)
