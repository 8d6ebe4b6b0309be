"""The operator report's summary of a trace over its columns (traces/table_summary.py): on fixed traces, as recorded
(recorded.py: when the sweep over events, since removed, gave the same, field by field), read through typed slices
or event by event through the checked path; figures worked out by hand on synthetic traces; a real DDP job's ranks
and training steps profiled here, whole and in groups of steps; and what the checked path refuses, in one line."""

from __future__ import annotations

import json
import os

import pytest
import torch

import torchmagic
from torchmagic.features.profile.summary import TraceSummary
from torchmagic.features.profile.traces import sliced

from . import summary_cases
from .record_summaries import key, summaries
from .recorded import assert_recorded, load
from .summary_cases import CASES, DEVICE_TRACES, _step
from .synthetic import event, write_trace

# a trace file of the corpus reads the same under any torch (CI's other torch lanes skip them: trace_files)
_FILES = {os.path.relpath(path, os.path.join(summary_cases.DATA, "..")) for path in DEVICE_TRACES}
_PARAMS = [pytest.param(name, marks=pytest.mark.trace_files) if name in _FILES else name for name in CASES]
# read event by event: the synthetic and random cases, and public traces of each schema and device
_CHECKED = [name for name in CASES if not name.startswith(("gpu/", "traces/"))] + [
    "traces/hta_cpu_train_eval.json.gz", "traces/hta_rocm_mi250.json.gz", "traces/hta_earlier_schema_kernels_only.json.gz",
    "traces/hta_cuda_event_sync.json.gz", "traces/hta_triton_compiled.json.gz"]


@pytest.fixture(scope="module")
def recorded() -> dict:
    return load()


def _summaries(name: str, folder) -> dict[str, TraceSummary]:
    return {key(name, grouping): summary for grouping, summary in summaries(CASES[name], str(folder))}


@pytest.mark.parametrize("name", _PARAMS)
def test_a_fixed_traces_summary_is_as_recorded(name, recorded, tmp_path):
    found = _summaries(name, tmp_path)
    assert sorted(found) == sorted(k for k in recorded if k == name or k.startswith(f"{name} (groups of"))
    for where, summary in found.items():
        assert_recorded(summary, recorded[where], where)


@pytest.mark.parametrize("name", _CHECKED)
def test_read_event_by_event_through_the_checked_path_a_trace_is_summarised_the_same(name, recorded, tmp_path,
                                                                                     monkeypatch):
    """Every slice refused by the typed decoder: each event read from its dict, each value checked (fields.py)."""
    monkeypatch.setattr(sliced, "decode_slice", lambda text: None)
    for where, summary in _summaries(name, tmp_path).items():
        assert_recorded(summary, recorded[where], where)


def test_synthetic_cases_of_each_kind(tmp_path):
    for where, summary in _summaries("synthetic_cases", tmp_path).items():
        assert summary.steps == 3 and summary.one_time_us and summary.python_ops and summary.sync_calls == 2, where
        assert {span.category for span in summary.timeline if span.name == "## tie ##"} == {"copies"}
        assert summary.hot_lines["train.py(10): step"] > 0 and list(summary.syncs_in_library) == [
            "site-packages/lib/mod.py(5): f"]
        assert summary.ops["aten::zeros_like"].allocated_bytes == 2 * 4096
        assert summary.allocated_total["cuda:0"] == 2 * 512
        # self time: addmm under linear under nothing; linear less addmm and t (190 - 170 - 5), twice
        assert summary.ops["aten::addmm"].self_cpu_us == 2 * 170 and summary.ops["aten::linear"].self_cpu_us == 2 * 15
        assert summary.ops["aten::relu"].calls == 6 and summary.step_us == [1000.0] * 3


def test_flops_and_the_kernels_of_a_counted_op(tmp_path):
    """--flops (the file says it was profiled with_flops): a convolution counted at the outermost op with a
    formula, nothing beneath it, and the kernel its innermost op launched timed under it; a pointwise op's
    bytes and estimated FLOPs: the figures FlopCounterMode's formulas give."""
    summary = _summaries("flops_conv", tmp_path)["flops_conv"]
    convolution = summary.ops["aten::convolution"]
    assert convolution.flops == 2 * (2 * 4 * 6 * 6) * (3 * 3 * 3)  # 2 x output elements x (C_in x kernel)
    assert convolution.flop_device_us == 30.0 and not summary.ops["aten::conv2d"].flops
    assert not summary.ops["aten::_convolution"].flops
    add = summary.ops["aten::add"]
    assert add.estimated_flops == 2 * 4 * 6 * 6 and add.bytes == 3 * 2 * 4 * 6 * 6 * 4 and add.dtype == "float"


def test_a_trace_without_steps_is_one_step_on_the_busiest_thread(tmp_path):
    """No marker: one step around the whole trace, on the thread that ran most ops (the first of those tied)."""
    summary = _summaries("no_steps", tmp_path)["no_steps"]
    assert summary.steps == 1 and summary.step_us == [95.0]  # from the first op's start to the last one's end
    assert {lane.lane for lane in summary.timeline} >= {"CPU main thread", "CPU thread 2"}
    assert summary.ops["aten::mm"].calls == 10


def test_a_kernel_of_no_length_carried_past_its_group(tmp_path):
    """The next group's data loading is counted as exposed: the kernel of no length covers none of it."""
    for where, summary in _summaries("kernel_of_no_length", tmp_path).items():
        assert summary.data_exposed_us == 50.0, where


def test_a_stair_of_ops_each_outliving_the_one_before(tmp_path):
    """2,000 ops nested each under the one before (in linear time): one called from Python, 2,000 calls."""
    summary = _summaries("stair", tmp_path)["stair"]
    assert summary.ops["aten::add"].calls == 2000 and summary.python_ops == 1


@pytest.mark.parametrize("steps_per_group", [None, 1, 2], ids=["whole", "groups-of-1", "groups-of-2"])
def test_a_real_ddp_jobs_ranks(job_traces, steps_per_group, monkeypatch):
    from torchmagic.features.profile.traces import ops
    for name in sorted(os.listdir(job_traces)):
        whole = torchmagic.analyze(os.path.join(job_traces, name))
        if steps_per_group is not None:
            monkeypatch.setattr(ops, "GROUP_EVENTS", max(1, steps_per_group * whole.events // 4))
        p = torchmagic.analyze(os.path.join(job_traces, name)).profile
        assert p.steps == 4 and {op.name: op.calls for op in p.ops} == {op.name: op.calls for op in whole.profile.ops}
        assert p.categories_s == pytest.approx(whole.profile.categories_s, rel=1e-9, abs=1e-12)
        assert any(op.name == "c10d::allreduce_" for op in p.ops)


def _train(shapes: bool, stacks: bool, memory: bool, path: str, flops: bool = False) -> None:
    """A transformer layer trained for 4 profiled steps on this machine's torch: data loading, autocast, a
    host read (.item()), a copy to contiguous memory, backward on autograd's thread, a foreach optimizer."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    optimizer = torch.optim.Adam(layer.parameters(), foreach=True)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8, 32)), batch_size=8)
    with torch.profiler.profile(record_shapes=shapes, with_stack=stacks, profile_memory=memory, with_flops=flops,
                                schedule=torch.profiler.schedule(wait=1, warmup=1, active=4)) as prof:
        for (x,) in data:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=shapes):
                out = layer(x.transpose(0, 1).contiguous().transpose(0, 1))
            loss = out.float().pow(2).mean()
            loss.item()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
            if prof.step_num >= 6:
                break
    prof.export_chrome_trace(path)


@pytest.mark.parametrize("shapes, stacks, memory, flops", [
    (False, False, False, False), (True, False, False, False), (True, True, False, False),
    (True, False, True, False), (True, False, False, True)], ids=["plain", "shapes", "stacks", "memory", "flops"])
def test_a_training_step_profiled_here(tmp_path, shapes, stacks, memory, flops):
    path = str(tmp_path / "train.json")
    _train(shapes, stacks, memory, path, flops)
    for summary in summaries(lambda folder: path, str(tmp_path)):
        summary = summary[1]
        assert summary.steps == 4 and summary.sync_calls == 4 and summary.optimizer_foreach
        assert summary.layout_copies >= 4 and summary.graph_nodes and summary.backward_nodes
        if shapes:
            assert summary.fp32_matmuls and summary.matmul_low_us > 0
            assert any(stats.shapes for stats in summary.ops.values())
        if stacks:
            assert summary.hot_lines
        if memory:
            assert summary.memory_recorded and summary.peak_allocated["cpu"] > 0
            assert any(stats.allocated_bytes for stats in summary.ops.values())
        if flops:  # the linear layers' matmuls, forward and backward, counted at the outermost op with a formula
            assert summary.ops["aten::addmm"].flops > 0 and summary.ops["aten::mm"].flops > 0
            assert not summary.ops["aten::linear"].flops and summary.ops["aten::add"].bytes > 0


@pytest.mark.parametrize("extra, refused", [
    (event("aten::mm", 3, 1, flops=-1), r'args\["flops"\] is -1, not a number of 0 or more'),
    ({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2,
      "args": {"Bytes": 4, "Device Type": 99}}, r'args\["Device Type"\] is 99, not a device type torch knows'),
    (event("aten::mm", 3, "5"), "'dur' is a string"),
    (event("## unfinished ##", 500, 18446744073709551, cat="user_annotation"), "'dur' is 1.84467e\\+16 µs, more than"),
    (event("aten::mm", 1.7e18, 5), "'ts' is 1.7e\\+18 µs, more than"),  # ns written as µs
    (event("gemm", 2, 1, cat="kernel", tid=7, correlation=2**63), 'args\\["correlation"\\] is an integer of 19'),
    (event("aten::mm", 3, 1, **{"External id": 2**64}), 'args\\["External id"\\] is an integer of 20 digits'),
    # named as a memory record: its size and device are read (and here refused), whatever its category
    (event("[memory]", 2, 1, cat="kernel", tid=7, **{"Bytes": 4, "Device Type": 99}), 'args\\["Device Type"\\] is 99'),
    (event("[memory]", 2, 1, cat="user_annotation", **{"Bytes": 4, "Device Type": 99}), 'args\\["Device Type"\\] is 99'),
], ids=["flops", "unknown-device", "string-duration", "huge-duration", "huge-start", "huge-correlation",
        "huge-external-id", "kernel-named-memory", "range-named-memory"])
def test_what_the_checked_path_refuses_is_said_in_one_line(tmp_path, extra, refused):
    path = str(write_trace(tmp_path / "t.json", [_step(1, 0), event("aten::add", 1, 5), extra]))
    with pytest.raises(ValueError, match=r"traceEvents\[2\] \(.*\): " + refused) as caught:
        torchmagic.analyze(path)
    assert "\n" not in str(caught.value)


def test_values_a_slice_does_not_take_as_written_are_read_as_the_checked_path_keeps_them(tmp_path):
    """A name not ASCII (its slice refused: a lone surrogate), a thread named by a string, an op of more inputs than
    are kept, a memory record written with a duration, a range named [memory]: each read, none lost."""
    events = [_step(1, 0), event("aten::mm \udc00", 1, 5), event("aten::add", 10, 5, tid="worker \u00e9"),
              event("aten::cat", 20, 5, **{"Input Dims": [[1]] * 5000}),
              {"ph": "X", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 30, "dur": 3,
               "args": {"Bytes": 64, "Device Type": 0}},
              event("[memory]", 40, 10, cat="user_annotation", **{"Bytes": 4, "Device Type": 0}),
              event("aten::mul", 41, 2)]
    events[3]["args"]["Input type"] = ["float"] * 5000
    p = torchmagic.analyze(str(write_trace(tmp_path / "t.json", events))).profile
    calls = {op.name: op.calls for op in p.ops}
    assert calls == {"aten::mm \ufffd": 1, "aten::add": 1, "aten::cat": 1, "aten::mul": 1, "[memory]": 1}, calls
    assert any("Shapes and input types of 1 op(s) with over 4,096 inputs were left out" in n for n in p.notes)
    # the memory record counts; the range named [memory] is a range (its size is checked, not counted)
    assert p.memory_peak_bytes == {"cpu": 64} and p.memory_allocated_bytes == {"cpu": 64}, p.memory_peak_bytes


def test_a_gzipped_public_trace_reads_through_analyze():
    path = os.path.join(summary_cases.DATA, "hta_cpu_train_eval.json.gz")
    text = torchmagic.analyze(path).to_text()
    assert "aten::" in text
    json.dumps(text)
