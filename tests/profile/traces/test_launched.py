"""RankTrace.launched_compute (over tensors) against the loop it replaced (bisect per runtime call and per kernel, an
IntervalSet per step), to the bit: on random steps, launches and kernels (ids out of order, steps whose id ranges
overlap, kernels of no length, calls outside every step), and on every real GPU trace under tests/data."""

from __future__ import annotations

import bisect
import glob
import math
import os
from array import array

import hypothesis
import pytest
from hypothesis import strategies as st

from torchmagic.features.profile.intervals import IntervalSet
from torchmagic.features.profile.traces.rank import RankTrace
from torchmagic.features.profile.traces.run import read_rank

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "traces")
TRACES = sorted(glob.glob(os.path.join(DATA, "*.json.gz")) + glob.glob(os.path.join(DATA, "*", "*.json.gz")))


def loop(trace: RankTrace) -> list[float] | None:
    """The loop launched_compute was until 2026-11-29."""
    windows = trace.windows()
    if not trace.steps or not trace.kernel_corr or not trace.launch_corr:
        return None
    starts = [start for _, start, _ in windows]
    lowest, highest = [math.inf] * len(windows), [-math.inf] * len(windows)
    for ts, corr in zip(trace.launch_ts, trace.launch_corr):
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts < windows[i][2]:
            lowest[i], highest[i] = min(lowest[i], corr), max(highest[i], corr)
    ranges = sorted((lowest[i], highest[i], i) for i in range(len(windows)) if lowest[i] <= highest[i])
    if not ranges:
        return None
    firsts = [r[0] for r in ranges]
    launched = [[] for _ in windows]
    for start, end, corr in zip(trace.kernel_start, trace.kernel_end, trace.kernel_corr):
        j = bisect.bisect_right(firsts, corr) - 1
        if j >= 0 and corr <= ranges[j][1]:
            launched[ranges[j][2]].append((start, end))
    return [float(IntervalSet.of(work).total()) for work in launched]


@st.composite
def traces(draw):
    trace = RankTrace("random")
    at = 0.0
    for number in draw(st.lists(st.integers(1, 50), max_size=6, unique=True)):
        length = draw(st.sampled_from([0.0, 5.0, 10.0, 7.5]))
        trace.steps[number] = (at, at + length)
        at += length + draw(st.sampled_from([0.0, 1.0, 3.3]))
    for _ in range(draw(st.integers(0, 40))):
        trace.launch_ts.append(draw(st.floats(-5, at + 5, allow_nan=False)))
        trace.launch_corr.append(draw(st.integers(1, 60)))
    for _ in range(draw(st.integers(0, 60))):
        start = draw(st.one_of(st.integers(0, 40).map(float), st.floats(0, 40, allow_nan=False)))
        trace.kernel_start.append(start)
        trace.kernel_end.append(start + draw(st.sampled_from([0.0, 1.0, 2.5, 0.1])))
        trace.kernel_corr.append(draw(st.integers(0, 65)))
    return trace


@hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
@hypothesis.given(traces())
def test_as_the_loop_did(trace):
    assert trace.launched_compute() == loop(trace)


@pytest.mark.trace_files
@pytest.mark.parametrize("path", TRACES, ids=[os.path.basename(p) for p in TRACES])
def test_on_real_traces(path):
    trace = read_rank(path)[0]
    assert trace.launched_compute() == loop(trace)


def test_empty_arrays_and_no_steps():
    trace = RankTrace("none")
    assert trace.launched_compute() is None
    trace.steps[1] = (0.0, 10.0)
    trace.launch_ts, trace.launch_corr = array("d", [20.0]), array("q", [1])  # outside the step
    trace.kernel_start, trace.kernel_end, trace.kernel_corr = array("d", [1.0]), array("d", [2.0]), array("q", [1])
    assert trace.launched_compute() is None and loop(trace) is None
