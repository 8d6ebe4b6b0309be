"""A job of one rank read from its trace gets the operator-level report %%torchprofile gives: the same
categories, operators and findings, kernels given to the ops that launched them, over every step, summarised
in groups of steps however its steps are sized."""

import os

import pytest

import torchmagic
from torchmagic.core.devices import DeviceInfo
from torchmagic.features.profile.traces import event_table, ops

from ...tabs import tabs
from .synthetic import event, write_trace

# a lone surrogate in a name: the typed decoder refuses its slice, whose events are read one by one (event_table.py)
CHECKED = event("PyTorch Profiler \udc00", 2, 1, cat="Trace")

@pytest.fixture
def one_rank_files(job_traces):
    return sorted(os.path.join(job_traces, f) for f in os.listdir(job_traces))


def test_one_ranks_trace_gets_the_operators_and_findings_of_torchprofile(one_rank_files):
    r = torchmagic.analyze(one_rank_files[1])  # the rank whose input pipeline is slow
    p = r.profile
    assert p is not None and p.steps == 4 and p.device.kind == "cpu"
    names = {op.name for op in p.ops}
    assert {"aten::mm", "c10d::allreduce_"} <= names and any(n.startswith("enumerate(DataLoader)") for n in names)
    assert p.categories_s["data loading"] > 0.3 * sum(p.categories_s.values())
    assert p.finding("dataloader") is not None and r.finding("dataloader") is p.finding("dataloader")
    text = r.to_text()
    name = os.path.basename(one_rank_files[1])
    assert f"Operators of {name} (rank 1), as %%torchprofile reports them:" in text
    assert "Top operators by self CPU time, totals over the 4 steps:" in text and "Operators" in [t for t, _ in _tabs(r)]
    assert r.to_dict()["profile"]["steps"] == 4
    assert torchmagic.analyze(one_rank_files).profile is None  # two ranks: the cross-rank report


def _tabs(r):
    return tabs(r.to_html())


def test_kernels_go_to_the_ops_that_launched_them_and_the_gpu_is_named(tmp_path):
    events = []
    for step in range(2):
        t = step * 1000
        events += [
            event(f"ProfilerStep#{step}", t, 900, cat="user_annotation"),
            event("aten::mm", t + 10, 100, **{"External id": 10 + step, "Input type": ["float", "float"],
                                              "Input Dims": [[4096, 4096], [4096, 4096]]}),
            event("cudaLaunchKernel", t + 20, 30, cat="cuda_runtime", **{"External id": 10 + step,
                                                                         "correlation": 500 + step}),
            event("sm80_xmma_gemm_f32f32", t + 60, 700, cat="kernel", tid=7, **{"External id": 10 + step,
                                                                               "correlation": 500 + step}),
            event("aten::add", t + 200, 50, **{"External id": 20 + step}),
            event("cudaLaunchKernel", t + 210, 20, cat="cuda_runtime", **{"External id": 20 + step,
                                                                          "correlation": 600 + step}),
            event("vectorized_elementwise_kernel", t + 770, 40, cat="kernel", tid=7,
                  **{"External id": 20 + step, "correlation": 600 + step}),
        ]
    path = write_trace(tmp_path / "gpu.json", events)
    data = __import__("json").load(open(path))
    data["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0}]
    __import__("json").dump(data, open(path, "w"))
    p = torchmagic.analyze(path).profile
    assert p.device == DeviceInfo("cuda", "cuda", "NVIDIA H100 80GB HBM3")
    by_name = {op.name: op for op in p.ops}
    assert by_name["aten::mm"].self_device_us == pytest.approx(1400)  # two 700 µs kernels
    assert by_name["aten::add"].self_device_us == pytest.approx(80)
    assert by_name["aten::mm"].calls == 2 and p.steps == 2


def test_a_big_trace_tables_the_operators_of_all_its_steps(one_rank_files, monkeypatch):
    whole = torchmagic.analyze(one_rank_files[0])
    monkeypatch.setattr(ops, "GROUP_EVENTS", whole.events // 3)  # 1 of the 4 steps a group
    grouped = torchmagic.analyze(one_rank_files[0])
    assert grouped.profile.steps == whole.profile.steps == grouped.ranks[0].steps == 4
    assert not any("first" in note for note in grouped.profile.notes)
    calls = {op.name: op.calls for op in grouped.profile.ops}
    assert calls == {op.name: op.calls for op in whole.profile.ops}


@pytest.mark.parametrize("checked", [False, True], ids=["typed", "checked"])
def test_a_step_far_heavier_than_the_average_is_tabled(tmp_path, monkeypatch, checked):
    """Groups are cut by the steps' average: a first step of 200 ops among steps of one is one group, tabled."""
    events = [event("ProfilerStep#1", 0, 1000, cat="user_annotation")]
    events += [event("aten::mm", 1 + 4 * i, 2, **{"External id": i + 1}) for i in range(200)]
    for step in range(2, 6):
        events += [event(f"ProfilerStep#{step}", 1000 * step, 900, cat="user_annotation"),
                   event("aten::add", 1000 * step + 1, 5, **{"External id": 1000 + step})]
    monkeypatch.setattr(ops, "GROUP_EVENTS", 50)  # 42 events a step on average: a group a step
    p = torchmagic.analyze(write_trace(tmp_path / "uneven.json", events + ([CHECKED] if checked else []))).profile
    assert p.steps == 5 and {op.name: op.calls for op in p.ops} == {"aten::mm": 200, "aten::add": 4}


@pytest.mark.parametrize("checked", [False, True], ids=["typed", "checked"])
def test_a_trace_without_steps_is_tabled_as_one_step_whatever_its_size(tmp_path, monkeypatch, checked):
    events = [event("aten::mm", 10 * i, 5, **{"External id": i + 1}) for i in range(50)]
    monkeypatch.setattr(ops, "GROUP_EVENTS", 20)
    p = torchmagic.analyze(write_trace(tmp_path / "long.json", events + ([CHECKED] if checked else []))).profile
    assert p.steps == 1 and "No ProfilerStep markers: the whole trace is read as one step." in p.notes
    assert {op.name: op.calls for op in p.ops} == {"aten::mm": 50}


def test_a_gpu_trace_with_misaligned_half_matmuls_and_short_kernels(tmp_path):
    """Kineto's events as a CUDA trace writes them: fp16 matmuls of a 50257-row output layer (off the
    tensor cores' grain of 8) and their launches, read through the same summary as a live profile."""
    events = []
    for step in range(2):
        t = step * 10_000
        events.append(event(f"ProfilerStep#{step}", t, 9_000, cat="user_annotation"))
        for i, (n, kernel_us) in enumerate([(50257, 4_000), (4096, 1_000)]):
            ext, corr, start = 100 * step + 10 * i + 1, 1000 * step + i + 1, t + 100 + 3_000 * i
            events += [
                event("aten::mm", start, 60, **{"External id": ext, "Input type": ["c10::Half", "c10::Half"],
                                                 "Input Dims": [[4096, 768], [768, n]]}),
                event("cudaLaunchKernel", start + 10, 20, cat="cuda_runtime", **{"External id": ext, "correlation": corr}),
                event("ampere_fp16_gemm", start + 45, kernel_us, cat="kernel", tid=7,
                      **{"External id": ext, "correlation": corr}),
            ]
        for k in range(20):  # launch-bound tail: 20 kernels of 3 µs
            ext, corr = 100 * step + 50 + k, 1000 * step + 50 + k
            events += [event("aten::add", t + 6_000 + 40 * k, 10, **{"External id": ext}),
                       event("cudaLaunchKernel", t + 6_002 + 40 * k, 5, cat="cuda_runtime",
                             **{"External id": ext, "correlation": corr}),
                       event("elementwise_kernel", t + 6_020 + 40 * k, 3, cat="kernel", tid=7,
                             **{"External id": ext, "correlation": corr})]
    path = write_trace(tmp_path / "gpu.json", events)
    p = torchmagic.analyze(path).profile
    found = p.finding("tensor_core_alignment")
    assert found is not None and found.evidence["shapes"] == ["4096x768x50257"]
    assert found.evidence["misaligned_share_of_kernels"] == pytest.approx(8_000 / (10_000 + 120), rel=1e-3)
    k = p.kernel_stats
    assert k["kernels_per_step"] == 22 and k["median_kernel_us"] == pytest.approx(3.0)
    assert k["short_kernel_share"] == pytest.approx(20 / 22) and k["median_launch_delay_us"] == pytest.approx(13.0)
    assert "Kernels: 22 per step, median 3" in p.to_text()


def test_a_gpu_trace_with_a_half_convolution_on_three_input_channels(tmp_path):
    """A 16-bit first convolution over RGB (3 channels in: off the grain) beside an aligned 64→64 one;
    a 3x3 kernel is not a dimension of the implicit GEMM and does not count."""
    events = []
    for step in range(2):
        t = step * 10_000
        events.append(event(f"ProfilerStep#{step}", t, 9_000, cat="user_annotation"))
        for i, (c_in, c_out, kernel_us) in enumerate([(3, 64, 3_000), (64, 64, 2_000)]):
            ext, corr, start = 100 * step + 10 * i + 1, 1000 * step + i + 1, t + 100 + 3_500 * i
            events += [
                event("aten::cudnn_convolution", start, 60, **{
                    "External id": ext, "Input type": ["c10::Half", "c10::Half", "", "", "", "", "", "", ""],
                    "Input Dims": [[32, c_in, 224, 224], [c_out, c_in, 3, 3], [], [], [], [], [], [], []]}),
                event("cudaLaunchKernel", start + 10, 20, cat="cuda_runtime", **{"External id": ext, "correlation": corr}),
                event("sm80_xmma_fprop_implicit_gemm", start + 45, kernel_us, cat="kernel", tid=7,
                      **{"External id": ext, "correlation": corr}),
            ]
    p = torchmagic.analyze(write_trace(tmp_path / "conv.json", events)).profile
    found = p.finding("tensor_core_alignment")
    assert found is not None and found.evidence["shapes"] == ["conv 3→64"]
    assert found.evidence["misaligned_share_of_kernels"] == pytest.approx(3_000 / 5_000)
    assert "channels" in found.fix and "conv 3→64" in found.title


def test_only_gemms_and_convolutions_are_judged_for_the_grain():
    from torchmagic.features.profile.traffic import off_tensor_core_grain

    assert off_tensor_core_grain("aten::mm", [[4096, 768], [768, 50257]]) == "4096x768x50257"
    assert off_tensor_core_grain("aten::addmm", [[1024], [64, 768], [768, 1024]]) is None
    assert off_tensor_core_grain("aten::cudnn_convolution", [[8, 64, 56, 56], [128, 64, 3, 3], []]) is None
    assert off_tensor_core_grain("aten::convolution_backward", [[8, 64, 56, 56], [8, 3, 56, 56], [64, 3, 7, 7]]) \
        == "conv 3→64"
    # attention's operands are not a GEMM's [M, K] x [K, N]: not judged here
    assert off_tensor_core_grain("aten::_scaled_dot_product_flash_attention", [[2, 8, 77, 64]] * 3) is None


@pytest.mark.parametrize("checked", [False, True], ids=["typed", "checked"])
def test_a_trace_is_read_once_whatever_it_holds(tmp_path, monkeypatch, checked):
    """Read into columns once, for the per-rank pass and the operator report both, its slices typed or its events
    read one by one."""
    events = [event("ProfilerStep#1", 0, 100, cat="user_annotation"), event("aten::mm", 1, 50, **{"External id": 1})]
    path = write_trace(tmp_path / "t.json", events + ([CHECKED] if checked else []))

    readers, reader = [], event_table.SlicedTraceReader

    def counted(*args):
        readers.append(args)
        return reader(*args)

    monkeypatch.setattr(event_table, "SlicedTraceReader", counted)
    p = torchmagic.analyze(path).profile
    assert p.steps == 1 and [op.name for op in p.ops] == ["aten::mm"] and len(readers) == 1


def test_of_two_refused_events_the_first_is_named(tmp_path):
    """A [memory] record's unknown device before a string duration: the file's first refused event is the error,
    with or without the operator report (one reading serves both)."""
    memory = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2,
              "args": {"Device Type": 99}}
    events = [event("aten::mm", 1, 50), memory, event("aten::add", 60, "5")]
    for operators in (True, False):
        with pytest.raises(ValueError, match=r"traceEvents\[1\] \(\"\[memory\]\"\): args\[\"Device Type\"\] is 99"):
            torchmagic.analyze(write_trace(tmp_path / "both.json", events), operators=operators)
    with pytest.raises(ValueError, match=r"traceEvents\[1\] \(\"aten::add\"\): .dur. is a string"):
        torchmagic.analyze(write_trace(tmp_path / "dur.json", events[:1] + events[2:]))


def test_rows_of_equal_figures_are_listed_by_name_whatever_order_the_trace_gave_them(tmp_path):
    """Ties are broken by name (summary.largest): the operator table, each op's top shapes and the report's text
    are the same for two files holding the same events in other orders, the ops' and the shapes' both."""
    def events(names: list[str], shapes: list[list[int]]) -> list[dict]:
        found = [event("ProfilerStep#1", 0, 1000, cat="user_annotation")]
        found += [event(name, 10 + 20 * i, 10, **{"External id": i + 1}) for i, name in enumerate(names)]
        found += [event("aten::mm", 500 + 20 * i, 10, **{"Input Dims": [dims, dims], "Input type": ["float"] * 2})
                  for i, dims in enumerate(shapes)]
        return found

    names, shapes = ["aten::relu", "aten::add", "aten::mul"], [[4, 4], [2, 2], [3, 3]]
    one = torchmagic.analyze(write_trace(tmp_path / "one.json", events(names, shapes))).profile
    other = torchmagic.analyze(write_trace(tmp_path / "other.json", events(names[::-1], shapes[::-1]))).profile
    rows = [(op.name, op.shapes) for op in one.sorted_ops()]
    assert rows == [(op.name, op.shapes) for op in other.sorted_ops()]
    assert [name for name, _ in rows] == ["aten::mm", "aten::add", "aten::mul", "aten::relu"]
    assert rows[0][1] == ("[2, 2], [2, 2]", "[3, 3], [3, 3]")
    assert one.to_text().replace("one.json", "") == other.to_text().replace("other.json", "")
