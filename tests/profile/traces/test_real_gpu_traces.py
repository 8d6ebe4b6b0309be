"""Traces of real GPU steps (tests/data/gpu: an H200, torch 2.11), read back as a user's saved trace
is, and held against what was measured beside them without the profiler (CUDA events)."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import pytest
import torch

import torchmagic
from torchmagic.core.devices.history import _allocations
from torchmagic.core.devices.oom import is_out_of_memory
from torchmagic.core.limits import describe_error

DATA = Path(__file__).parent.parent.parent / "data" / "gpu"
CAPTURE = json.loads((DATA / "capture.json").read_text())
TRACES = ["fp32_training", "bf16_autocast_training", "compiled_training", "cuda_graphs_training", "explicit_sync"]


def _rank(name: str):
    analysis = torchmagic.analyze(DATA / f"{name}.json.gz")
    return analysis, analysis.ranks[0]


@pytest.mark.parametrize("name", TRACES)
def test_kernel_time_read_back_is_what_the_live_profile_measured_and_fits_the_unprofiled_step(name):
    analysis, rank = _rank(name)
    live = CAPTURE["traces"][name]
    assert rank.steps == CAPTURE["machine"]["steps"] == 4
    # the same kernels, read from the file, as the live profile read them (forward + backward + optimizer ...)
    assert rank.compute_s == pytest.approx(sum(live["device_categories_s"].values()) / rank.steps, rel=0.005)
    # CUPTI's kernel times fit inside the step CUDA events timed without the profiler
    assert rank.compute_s <= live["cuda_event_step_s"] * 1.01


def test_a_compute_bound_step_is_not_called_idle_for_the_profilers_first_step():
    """The first profiled step took 11.25 ms against 4.4 ms for the others (the profiler starting);
    un-profiled, CUDA events timed the step at 3.62 ms with 3.60 ms of kernels: not idle."""
    live = CAPTURE["traces"]["fp32_training"]
    assert live["step_s"][0] > 2 * sorted(live["step_s"])[1]
    analysis, rank = _rank("fp32_training")
    assert rank.compute_s / live["cuda_event_step_s"] > 0.95
    assert "gpu_idle" not in {f.rule for f in analysis.findings}
    assert "amp" in {f.rule for f in analysis.findings}  # 95% of kernel time in fp32 GEMMs on an H200


def test_a_launch_bound_step_is_called_idle_as_cuda_events_confirm():
    """Under bf16 autocast the kernels take 0.6 ms of a 3.14 ms un-profiled step."""
    live = CAPTURE["traces"]["bf16_autocast_training"]
    analysis, rank = _rank("bf16_autocast_training")
    truth = 1 - rank.compute_s / live["cuda_event_step_s"]
    idle = [f for f in analysis.findings if f.rule == "gpu_idle"]
    assert truth > 0.75 and idle, analysis.findings
    assert f"{truth:.0%}" in idle[0].title or abs(idle[0].evidence["idle_ms_per_step"] / 1e3
                                                   / live["cuda_event_step_s"] - truth) < 0.1


def test_cuda_graph_replays_count_their_kernels():
    _, graphs = _rank("cuda_graphs_training")
    _, eager = _rank("fp32_training")
    assert graphs.compute_s == pytest.approx(eager.compute_s, rel=0.03)


def test_an_explicit_synchronize_and_item_are_found():
    analysis, _ = _rank("explicit_sync")
    assert "sync" in {f.rule for f in analysis.findings}


def test_the_allocators_out_of_memory_message_of_torch_2_11_is_recognised_and_shown_in_one_line():
    message = CAPTURE["out_of_memory"]["allocator"]
    assert "private pools" in message  # new in the message since torch 2.10
    for exc in (torch.OutOfMemoryError(message), RuntimeError(message)):  # AcceleratorError is a RuntimeError
        assert is_out_of_memory(exc)
        shown = describe_error(exc, width=200)
        assert shown == (f"{type(exc).__name__}: CUDA out of memory. Tried to allocate 279.60 GiB. GPU 0 has a total "
                         "capacity of 139.80 GiB of which 138.36 GiB is free. Including non-PyTorch memory, this process "
                         "has 1.43 GiB memory in use."), shown  # whole sentences: the next one is cut off


def test_a_real_allocator_history_reads_as_allocations_with_the_steps_frames():
    with gzip.open(DATA / "allocator_history.pickle.gz", "rb") as f:
        snapshot = pickle.load(f)  # noqa: S301  (our own capture, checked in)
    allocations = _allocations(snapshot["device_traces"][0], None)
    assert allocations and all(a.size > 0 for a in allocations)
    assert any("gpu_capture.py" in frame for a in allocations for frame in a.frames)
