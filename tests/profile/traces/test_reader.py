"""The streaming reader gives exactly what json.load gives, wherever its chunks end."""

import gzip
import json

import pytest
import torch

from torchmagic.features.profile.traces import reader as reader_module
from torchmagic.features.profile.traces.reader import TraceReader


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.json"
    model = torch.nn.Linear(16, 16)
    with torch.profiler.profile(record_shapes=True) as prof:
        model(torch.randn(4, 16)).sum().backward()
    prof.export_chrome_trace(str(path))
    return path


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_every_chunk_size_reads_what_json_load_reads(real_trace, chunk, monkeypatch, tmp_path):
    monkeypatch.setattr(reader_module, "CHUNK_CHARS", chunk)
    expected = json.load(open(real_trace))
    reader = TraceReader(real_trace)
    assert list(reader) == expected["traceEvents"]
    assert reader.meta == {k: v for k, v in expected.items() if k != "traceEvents"}
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(real_trace.read_bytes()))
    assert list(TraceReader(packed)) == expected["traceEvents"]


def test_literals_and_numbers_cut_at_any_chunk_boundary(tmp_path, monkeypatch):
    """true, false, null and numbers fail to decode at their start when cut (`tru|e`): every cut is read on."""
    events = [{"ph": "X", "ts": 4845727164162.245, "dur": 348.526, "name": "aten::ones",
               "args": {"finished": True, "flag": False, "none": None, "n": -1.5e-07}}] * 3
    text = json.dumps({"schemaVersion": 1, "traceEvents": events, "done": True}, indent=2)
    (tmp_path / "t.json").write_text(text)
    for chunk in range(1, 80):
        monkeypatch.setattr(reader_module, "CHUNK_CHARS", chunk)
        reader = TraceReader(tmp_path / "t.json")
        assert list(reader) == events, chunk
        assert reader.meta == {"schemaVersion": 1, "done": True}, chunk


def test_a_bare_array_and_numbers_split_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(reader_module, "CHUNK_CHARS", 3)
    events = [{"ph": "X", "ts": 123456789.125, "dur": 1e-3, "name": "a\\"}, {"ph": "i", "ts": -1}]
    (tmp_path / "a.json").write_text(" \n" + json.dumps(events, indent=2) + "\n")
    assert list(TraceReader(tmp_path / "a.json")) == events


