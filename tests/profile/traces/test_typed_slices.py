"""The typed path (sliced.py, records.py) reads what the checked path reads: a slice the decoder refuses,
and an event whose values are not plain among good ones, go through the checked path, with the same
report, notes and one-line errors as a file read by the checked path alone."""

from __future__ import annotations

import dataclasses
import json

import hypothesis
import pytest
import torch
from hypothesis import strategies as st

import torchmagic
from torchmagic.features.profile.traces import event_table, sliced
from torchmagic.features.profile.traces.event_table import TIME_LIMIT_US, ns_of, one_ns_of
from torchmagic.features.profile.traces.reader import TraceFileError


def _op(i: int, **fields) -> dict:
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000 * (i // 40) + 10 + i % 40,
             "dur": 0.5, "args": {"External id": i, "Sequence number": i, "Input Dims": [[2, 3], [3, 4 + i % 3]],
                                  "Input type": ["float", "float"], "Concrete Inputs": ["", ""]}}
    event.update(fields)
    return event


def _trace(path, odd: dict[int, dict]) -> str:
    """Ten steps of 40 ops each; op ``i`` in ``odd`` with those fields changed."""
    steps = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": 1000 * n,
              "dur": 900} for n in range(10)]
    events = steps + [_op(i, **odd.get(i, {})) for i in range(400)]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=1))
    return str(path)


def _report(path: str):
    try:
        r = torchmagic.analyze(path)
    except TraceFileError as exc:
        return str(exc)
    return {k: v for k, v in dataclasses.asdict(r).items() if k != "analysis_s"}


class _CheckedOnly(sliced.SlicedTraceReader):
    """The checked path alone (reader.py's, as before the typed path), each event a batch."""

    def _array(self):
        for event in self._events():
            yield sliced.Batch(self.index, None, None, [event])


def _checked_only(path: str, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(event_table, "SlicedTraceReader", _CheckedOnly)
        return _report(path)


ODD = {
    "external-id-fraction": {"args": {"External id": 3.0}},  # the decoder refuses the slice; the check reads 0
    "name-not-ascii": {"name": "aten::m\u00e9"},              # decoded, not plain: read from its dict
    "args-null": {"args": None},
    "inputs-5000": {"args": {"Input Dims": [[]] * 5000}},      # left out, and counted in a note
    "dur-negative": {"dur": -1},                                # refused, naming the event
    "ts-string": {"ts": "12"},
    "shape-negative": {"args": {"Input Dims": [[2, -3]]}},
}


@pytest.mark.parametrize("odd", ODD)
def test_one_odd_event_among_good_ones_reads_as_the_checked_path_reads_it(odd, tmp_path, monkeypatch):
    monkeypatch.setattr(sliced, "SLICE_CHARS", 3000)  # about ten events a slice: the odd one inside one
    path = _trace(tmp_path / "t.json", {217: ODD[odd]})
    typed = _report(path)
    assert typed == _checked_only(path, monkeypatch)
    if isinstance(typed, str):
        assert "traceEvents[227]" in typed  # the index counts the slices before it (10 steps first)
    else:
        assert typed["profile"] is not None and typed["events"] == 410


def test_slices_read_typed_where_they_can(tmp_path, monkeypatch):
    """The good slices are decoded typed, the refused one goes through the checked path alone."""
    monkeypatch.setattr(sliced, "SLICE_CHARS", 3000)
    path = _trace(tmp_path / "t.json", {217: ODD["external-id-fraction"]})
    kinds = [batch.records is not None for batch in sliced.SlicedTraceReader(path)]
    assert kinds.count(False) < 20 < kinds.count(True)


def test_a_number_json_cannot_convert_beside_an_event_read_from_its_dict(tmp_path, monkeypatch):
    """msgspec skips a key no report reads, whatever its number's length; where json then decodes that slice
    for an event that is not plain (an op of more inputs than are kept), its refusal is the checked path's one
    line, naming the event."""
    monkeypatch.setattr(sliced, "SLICE_CHARS", 60_000)  # the long number and the odd name in one slice
    huge = _op(216)
    huge["args"]["unread"] = 0
    path = _trace(tmp_path / "t.json", {215: ODD["inputs-5000"], 216: {"args": huge["args"]}})
    (tmp_path / "t.json").write_text((tmp_path / "t.json").read_text().replace('"unread": 0', '"unread": ' + "9" * 5000))
    assert any(batch.records and len(batch.records) > 100 for batch in sliced.SlicedTraceReader(path))
    typed = _report(path)
    assert typed == _checked_only(path, monkeypatch)
    assert "traceEvents[226]" in typed and "holds a number too long to read" in typed


@hypothesis.settings(max_examples=500, deadline=None, derandomize=True)
@hypothesis.given(st.one_of(st.floats(-TIME_LIMIT_US, TIME_LIMIT_US, allow_nan=False, exclude_min=True,
                                      exclude_max=True),
                            st.integers(-10**15, 2 * 10**15).map(lambda us: us / 4)))
def test_a_time_is_the_same_ns_in_a_slice_as_read_alone(us):
    """The typed path makes a slice's µs ns over tensors, the checked path one event's alone: the same ns."""
    assert one_ns_of(us) == ns_of(torch.tensor([us], dtype=torch.float64)).item()


def test_times_past_2_to_the_53_ns_are_exact():
    """µs since the epoch as HTA's traces write them (1.7e15): µs x 1000 in float64 would round to 256 ns."""
    times = torch.tensor([1707417525512145.0, 1712195495406752.8, -2.25, 0.0015], dtype=torch.float64)
    assert ns_of(times).tolist() == [1707417525512145000, 1712195495406752750, -2250, 2]
    assert [one_ns_of(us) for us in times.tolist()] == ns_of(times).tolist()
