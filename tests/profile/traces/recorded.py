"""Operator summaries of fixed traces, recorded: each summary's fields (a long list or dict by its length, its first
items and the sums of its numbers), held to what ``record_summaries.py`` wrote to
tests/data/operator_summaries.json.gz.

They were first recorded when two implementations agreed on every one, field by field: the sweep over events
(profile/sweep.py, removed since) and the table summary.  A change that moves a figure fails here; re-record
(``python -m tests.profile.traces.record_summaries``) only for a change meant to move it, and say why in the
commit."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os

import pytest

from torchmagic.features.profile.summary import TraceSummary

RECORDED = os.path.join(os.path.dirname(__file__), "..", "..", "data", "operator_summaries.json.gz")
RANKS_RECORDED = os.path.join(os.path.dirname(__file__), "..", "..", "data", "rank_traces.json.gz")
LONG = 32  # a list or dict longer than this is kept as its length, first items and the sums of its numbers


def fingerprint(value):
    """``value`` (a TraceSummary, or any part of one) as plain JSON values, dicts as lists of pairs by key (the
    order a dict was filled in is no figure: every view sorts its rows, ties by name)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: fingerprint(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        pairs = sorted(([_key(key), item] for key, item in value.items()), key=lambda pair: pair[0])
        if len(pairs) > LONG:
            return _long([pair[1] for pair in pairs], [[key, fingerprint(item)] for key, item in pairs[:LONG]])
        return [[key, fingerprint(item)] for key, item in pairs]
    if isinstance(value, (set, frozenset)):
        value = sorted(value, key=repr)
    if isinstance(value, (list, tuple)) or hasattr(value, "typecode"):
        items = list(value)
        if len(items) > LONG:
            return _long(items, [fingerprint(item) for item in items[:LONG]])
        return [fingerprint(item) for item in items]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def rank_fingerprint(trace) -> dict:
    """A RankTrace (the per-rank pass's reduction of a file) as plain JSON values: its unions as their merged
    intervals, its collectives, its launch and kernel ids, and what each step launched (not where the case was
    written: its path, the name the file gives itself and so its length)."""
    fields = {}
    for name, value in vars(trace).items():
        if name in ("path", "bytes_read"):
            continue
        if name == "meta":
            value = {key: item for key, item in value.items() if key != "traceName"}
        fields[name] = fingerprint(list(value.merged()) if hasattr(value, "merged") else value)
    fields["launched_compute"] = fingerprint(trace.launched_compute())
    return fields


def _long(items: list, first: list) -> dict:
    """A long list's (or dict's values') length, first items, and the sums of its numbers (of each numeric field
    of its dataclasses), and of plain numbers their bounds."""
    kept = {"len": len(items), "first": first}
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in items):
        kept.update(sum=float(sum(items)), min=min(items), max=max(items))
    elif items and dataclasses.is_dataclass(items[0]):
        kept["sums"] = {f.name: float(sum(getattr(x, f.name) for x in items)) for f in dataclasses.fields(items[0])
                        if all(type(getattr(x, f.name)) in (int, float) for x in items)}
    return kept


def _key(key) -> str:
    return key if isinstance(key, str) else repr(key)


def load(path: str = RECORDED) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def assert_recorded(summary: TraceSummary, recorded, where: str = "summary") -> None:
    """``summary`` as recorded, floats to 1e-9 of their value (or 1e-6 µs), dicts by key."""
    _same(fingerprint(summary), recorded, where)


def assert_rank_recorded(trace, recorded, where: str = "rank") -> None:
    """A RankTrace as recorded, as ``assert_recorded`` compares."""
    _same(rank_fingerprint(trace), recorded, where)


def _same(a, b, where: str) -> None:
    if isinstance(b, dict):
        assert list(a) == list(b), where
        for key in b:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), f"{where}: {len(a) if isinstance(a, list) else a} items, " \
                                                         f"recorded {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(b, float) and not isinstance(a, bool):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-6), where
    else:
        assert a == b, where
