"""The per-rank pass over typed slices (rank._Reading.records: its own loop over the records, a record that is not
plain read from its dict) against the checked path reading every event from its dict: the same RankTrace, field by
field, on every real trace under tests/data (GPU jobs of several schemas, CPU jobs, ROCm, MTIA), a real DDP job's
ranks, and slices cut small."""

from __future__ import annotations

import glob
import os

import pytest

from torchmagic.features.profile.traces import sliced
from torchmagic.features.profile.traces.rank import RankTrace, read_rank
from torchmagic.features.profile.traces.sliced import SlicedTraceReader

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "traces")
TRACES = sorted(glob.glob(os.path.join(DATA, "*.json.gz")) + glob.glob(os.path.join(DATA, "*", "*.json.gz")))


class _CheckedOnly(SlicedTraceReader):
    """The checked path alone: each event its own batch, read from its dict."""

    def _array(self):
        for event in self._events():
            yield sliced.Batch(self.index, None, None, [event])


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
    typed, checked = (_fields(read_rank(reader(path), path)) for reader in (SlicedTraceReader, _CheckedOnly))
    assert typed.keys() == checked.keys()
    for name in typed:
        assert typed[name] == checked[name], f"{os.path.basename(path)}: {name} differs"


@pytest.mark.parametrize("path", TRACES, ids=[os.path.basename(p) for p in TRACES])
def test_every_real_trace_reads_as_the_checked_path_reads_it(path):
    _assert_same(path)


@pytest.mark.parametrize("path", TRACES[:4], ids=[os.path.basename(p) for p in TRACES[:4]])
def test_in_small_slices_too(path, monkeypatch):
    monkeypatch.setattr(sliced, "SLICE_CHARS", 2000)  # a few events a batch: the batch's edges everywhere
    _assert_same(path)


def test_a_real_ddp_jobs_ranks(job_traces):
    for path in sorted(glob.glob(os.path.join(job_traces, "*.json"))):
        _assert_same(path)
