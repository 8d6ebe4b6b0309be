"""The columnar summary (traces/columnar.py) against the sweep's (profile/sweep.py through summarizer.py) on the
same trace, field by field: real traces of this machine's torch, a real DDP job's ranks, a public one, and
synthetic traces holding each case the sweep tells apart (nesting, phases, syncs, copies, matmuls, threads)."""

from __future__ import annotations

import dataclasses
import json
import os

import hypothesis
import pytest
import torch

import torchmagic
from torchmagic.features.profile.summary import TraceSummary
from torchmagic.features.profile.traces import ops
from torchmagic.features.profile.traces.columnar import columnar_summary
from torchmagic.features.profile.traces.columns import ColumnReading
from torchmagic.features.profile.traces.rank import read_rank
from torchmagic.features.profile.traces.sliced import SlicedTraceReader

from .summaries import assert_same
from .synthetic import event, write_trace

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "traces")


def _both(path: str, steps_per_group: int | None) -> tuple[TraceSummary, TraceSummary]:
    """The trace's summary by the columns, and by the sweep over its events (no columns given to
    operator_summary): held at once, or in groups of about ``steps_per_group`` steps."""
    reading, reader = ColumnReading(path), SlicedTraceReader(path)
    trace = read_rank(reader, path, reading)
    assert reading.columns is not None, "the trace was not read into columns"
    limit = trace.events if steps_per_group is None else max(1, int(steps_per_group * trace.events / len(trace.steps)))
    flops = reading.columns.flops or ops._profiled_with_flops(reader.meta)
    columnar, first, _ = columnar_summary(reading.columns, trace, limit, flops)
    read = ops.operator_summary(trace, limit)
    if read is None:  # groups the events path refuses (far heavier than the average): the columns table them
        return columnar, None
    swept, seen = read
    assert first == seen.start
    return columnar, swept


def _assert_same(path: str, steps_per_group: int | None = None) -> TraceSummary:
    columnar, swept = _both(path, steps_per_group)
    for f in dataclasses.fields(TraceSummary):
        assert_same(getattr(columnar, f.name), getattr(swept, f.name), f.name, ordered=True)
    return columnar


@pytest.mark.parametrize("steps_per_group", [None, 1, 2], ids=["whole", "groups-of-1", "groups-of-2"])
def test_a_real_ddp_jobs_ranks(job_traces, steps_per_group):
    for name in sorted(os.listdir(job_traces)):
        summary = _assert_same(os.path.join(job_traces, name), steps_per_group)
        assert summary.steps == 4 and summary.python_ops and summary.backward_nodes and summary.data_us > 0


@pytest.mark.parametrize("name", ["hta_cpu_train_eval.json.gz", "hta_cpu_gloo_rank-34.json.gz"])
def test_public_cpu_traces(name):
    """HTA's CPU traces (shapes recorded): the two of the corpus that hold only host work."""
    _assert_same(os.path.join(DATA, name))


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
    _assert_same(path, steps_per_group=1)
    summary = _assert_same(path)
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


def _memory(ts: float, nbytes: int, device_type: int = 0, tid=1) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": tid, "ts": ts, "s": "t",
            "args": {"Total Reserved": 0, "Total Allocated": 0, "Bytes": nbytes, "Addr": 1, "Device Type": device_type,
                     "Device Id": 0 if device_type else -1}}


def _step(number: int, start: float, tid=1):
    return event(f"ProfilerStep#{number}", start, 1000, cat="user_annotation", tid=tid)


def _cases(t: float) -> list[dict]:
    """One step's worth of what the sweep tells apart, from time ``t``."""
    bf16, fp32 = ["c10::BFloat16", "c10::BFloat16"], ["float", "float"]
    return [
        event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 10, 90, cat="user_annotation"),
        event("aten::stack", t + 20, 30),
        event("aten::linear", t + 110, 190, **{"Sequence number": 5}),
        event("aten::t", t + 115, 5),
        event("aten::addmm", t + 120, 170, **{"Input type": fp32 + ["float"], "Input Dims": [[4], [4, 8], [8, 4]],
                                               "Concrete Inputs": ["", "", "", "1", "1"]}),
        event("train.py(10): step", t + 300, 30, cat="python_function"),  # the user's code ...
        event("site-packages/lib/mod.py(5): f", t + 300, 28, cat="python_function"),  # ... calling a library
        event("site-packages/lib/inner.py(9): g", t + 300, 26, cat="python_function"),  # (the first call counts)
        event("aten::item", t + 300, 20),
        event("aten::_local_scalar_dense", t + 305, 10),
        event("aten::empty", t + 330, 0),
        event("aten::view", t + 330, 0),  # two zero-length events at one start
        event("aten::zeros_like", t + 331, 9),
        _memory(t + 331.5, 4096),  # allocated under zeros_like: its row is made now, before new_fill's
        event("aten::new_fill", t + 332, 3),
        _memory(t + 333, 512, device_type=1),  # under new_fill, on cuda:0
        _memory(t + 336, -4096),  # freed
        event("## a range ##", t + 341, 4, cat="user_annotation"),
        _memory(t + 342, 64),  # under a user range: no op's
        event("aten::outer_alloc", t + 350, 20),
        event("aten::inner_op", t + 351, 2),
        _memory(t + 355, 256),  # its visit closes inner_op first: inner_op's row comes before outer_alloc's
        event("aten::add", t + 400, 50, **{"Sequence number": 6}),
        event("aten::copy_", t + 420, 60),  # outlives its parent
        event("aten::contiguous", t + 500, 20),
        event("aten::clone", t + 505, 10),
        event("aten::copy_", t + 506, 8),
        event("entire_frame_compile", t + 530, 70, cat="user_annotation"),
        event("aten::mm", t + 540, 20, **{"Input type": fp32, "Input Dims": [[4, 4], [4, 4]]}),
        event("autograd::engine::evaluate_function: MmBackward0", t + 600, 100, **{"Sequence number": 5}),
        event("MmBackward0", t + 610, 80, **{"Sequence number": 5}),
        event("aten::mm", t + 620, 60, **{"Input type": bf16, "Input Dims": [[8, 16], [16, 8]]}),
        event("Optimizer.step#SGD.step", t + 700, 100, cat="user_annotation"),
        event("aten::_foreach_add_", t + 710, 60),
        event("_compile.compile_inner", t + 775, 20, cat="user_annotation"),  # a compile inside a phase: start-up
        event("## forward ##", t + 800, 100, cat="user_annotation"),
        event("aten::relu", t + 810, 80, **{"Sequence number": 7}),
        event("aten::relu", t + 920, 30, **{"Sequence number": 8}),  # Python between it and the one before
        event("## tie ##", t + 960, 20, cat="user_annotation"),  # copies and forward 10 µs each: the first closed
        event("aten::copy_", t + 960, 10),
        event("aten::relu", t + 970, 10),
        event("autograd::engine::evaluate_function: AddBackward0", t + 200, 300, tid=2, **{"Sequence number": 6}),
        event("aten::mul", t + 210, 100, tid=2),
    ]


def test_synthetic_cases_of_each_kind(tmp_path):
    events = [event("PyTorch Profiler (0)", -5, 4000, cat="Trace"), _step(1, 0), _step(2, 1000), _step(3, 2000),
              event("## training loop ##", -3, 3500, cat="user_annotation")]  # open across every group's start
    events += _cases(0) + _cases(1000)
    events += [event("aten::neg", 2010, 10)]  # Python from step 2's last op to it is not a gap: another step
    events += [event("aten::ones", 3100, 100), event("aten::zeros", 3150, 10, tid="a thread")]  # after the steps
    events += [_memory(-4, 1 << 20), _memory(3120, 8)]  # held from before the steps; allocated after them
    path = write_trace(tmp_path / "cases.json", events)
    _assert_same(path, steps_per_group=1)
    summary = _assert_same(path)
    assert summary.steps == 3 and summary.one_time_us and summary.python_ops and summary.sync_calls == 2
    assert {span.category for span in summary.timeline if span.name == "## tie ##"} == {"copies"}
    assert summary.hot_lines["train.py(10): step"] > 0 and list(summary.syncs_in_library) == [
        "site-packages/lib/mod.py(5): f"]
    assert summary.ops["aten::zeros_like"].allocated_bytes == 2 * 4096 and summary.allocated_total["cuda:0"] == 2 * 512


def test_flops_and_the_kernels_of_a_counted_op(tmp_path):
    """--flops (the file says it was profiled with_flops): a convolution counted at the outermost op with a
    formula, nothing beneath it, and the kernel its innermost op launched timed under it; a pointwise op's
    bytes and estimated FLOPs.  The columns give what the sweep gives, and the figures FlopCounterMode's
    formulas give."""
    conv = {"Input Dims": [[2, 3, 8, 8], [4, 3, 3, 3], [4]] + [[]] * 6, "Input type": ["float"] * 3 + [""] * 6,
            "Concrete Inputs": ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]}
    events = [_step(1, 0),
              event("aten::conv2d", 10, 100, **{"External id": 1}, **conv),
              event("aten::convolution", 12, 96, **{"External id": 2}, **conv),
              event("aten::_convolution", 14, 92, **{"External id": 3}, **conv),
              event("aten::cudnn_convolution", 16, 88, **{"External id": 4}),
              event("cudaLaunchKernel", 20, 10, cat="cuda_runtime", correlation=100, **{"External id": 4}),
              event("implicit_gemm", 40, 30, cat="kernel", tid=7, correlation=100, **{"External id": 4}),
              event("aten::add", 200, 10, **{"External id": 5, "Input Dims": [[2, 4, 6, 6], [2, 4, 6, 6]],
                                             "Input type": ["float", "float"], "Concrete Inputs": ["", "", "1"]})]
    with open(write_trace(tmp_path / "flops.json", events)) as f:
        data = json.load(f)
    data["with_flops"] = 1
    path = tmp_path / "flops.json"
    path.write_text(json.dumps(data))
    summary = _assert_same(str(path))
    convolution = summary.ops["aten::convolution"]
    assert convolution.flops == 2 * (2 * 4 * 6 * 6) * (3 * 3 * 3)  # 2 x output elements x (C_in x kernel)
    assert convolution.flop_device_us == 30.0 and not summary.ops["aten::conv2d"].flops
    assert not summary.ops["aten::_convolution"].flops
    add = summary.ops["aten::add"]
    assert add.estimated_flops == 2 * 4 * 6 * 6 and add.bytes == 3 * 2 * 4 * 6 * 6 * 4 and add.dtype == "float"


def test_synthetic_trace_without_steps(tmp_path):
    """No marker: one step around the whole trace, on the thread that ran most ops (the first of those tied)."""
    events = [event("aten::mm", 10 * i, 5, tid=1 + i % 2) for i in range(10)]
    events += [event("## a range ##", 3, 40, cat="user_annotation", tid=3)]
    summary = _assert_same(write_trace(tmp_path / "flat.json", events))
    assert summary.steps == 1 and {lane.lane for lane in summary.timeline} >= {"CPU main thread", "CPU thread 2"}


@pytest.mark.parametrize("extra", [
    event("aten::mm", 3, 1, flops=-1),
    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2,
     "args": {"Bytes": 4, "Device Type": 99}},  # a device type torch does not know: the events path refuses it
    event("aten::mm", 3, "5"),  # a duration the checked path refuses
    event("## unfinished ##", 500, 18446744073709551, cat="user_annotation"),  # 2**64 ns: past int64
    event("aten::mm", 1.7e18, 5),  # ns written as µs: past int64 in ns
    event("gemm", 2, 1, cat="kernel", tid=7, correlation=2**63),  # CUPTI's id past int64: the checked path refuses it
    # named as a memory record: the checked path reads (and here refuses) its size and device, whatever its category
    event("[memory]", 2, 1, cat="kernel", tid=7, **{"Bytes": 4, "Device Type": 99}),
    event("[memory]", 2, 1, cat="user_annotation", **{"Bytes": 4, "Device Type": 99}),
], ids=["flops", "unknown-device", "string-duration", "huge-duration", "huge-start", "huge-correlation",
        "kernel-named-memory", "range-named-memory"])
def test_what_the_columns_do_not_cover_is_read_as_before(tmp_path, extra):
    path = str(write_trace(tmp_path / "t.json", [_step(1, 0), event("aten::add", 1, 5), extra]))
    reading = ColumnReading(path)
    try:
        read_rank(SlicedTraceReader(path), path, reading)
    except ValueError:
        pass  # refused by the per-rank pass: torchmagic.analyze says so in one line
    assert reading.columns is None


def test_a_kernel_of_no_length_carried_past_its_group(tmp_path):
    """A kernel of no length whose launch is not in the trace, after a group's last step, is carried to the next
    group as the summarizer carries it (an interval of no length): the next group's data loading is then counted
    as exposed, as the events path counts it."""
    events = [_step(1, 0) | {"dur": 100}, _step(2, 200) | {"dur": 100},
              event("gemm_kernel", 150, 0, cat="kernel", tid=7),
              event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 210, 50, cat="user_annotation")]
    path = write_trace(tmp_path / "t.json", events)
    assert _assert_same(path, steps_per_group=1).data_exposed_us == 50.0
    _assert_same(path)


def test_a_stair_of_ops_each_outliving_the_one_before(tmp_path):
    """Each op starts inside the one before and ends after it (1 ns of clock jitter): the sweep nests them
    all, each under the one before, 2,000 deep, and so does the columnar summary (in linear time)."""
    events = [_step(1, 0)] + [event("aten::add", 1 + 0.4 * i, 0.401) for i in range(2000)]
    summary = _assert_same(write_trace(tmp_path / "stair.json", events))
    assert summary.ops["aten::add"].calls == 2000 and summary.python_ops == 1


def test_analyze_reads_a_host_only_trace_once_into_columns(tmp_path, monkeypatch):
    events = [_step(1, 0)] + _cases(0)
    path = write_trace(tmp_path / "t.json", events)

    def no_second_reading(path):
        raise AssertionError("the operator pass read the file again")

    monkeypatch.setattr(ops, "SlicedTraceReader", no_second_reading)
    profile = torchmagic.analyze(path).profile
    assert profile.steps == 1 and any(op.name == "aten::addmm" for op in profile.ops)


def test_a_gzipped_public_trace_reads_the_same_through_analyze():
    """Through torchmagic.analyze, as a user calls it: the report of the columns is the sweep's."""
    path = os.path.join(DATA, "hta_cpu_train_eval.json.gz")
    text = torchmagic.analyze(path).to_text()
    assert "aten::" in text
    json.dumps(text)


_VOCABULARY = [  # (name, category): a name of each kind the sweep tells apart
    ("aten::mm", "cpu_op"), ("aten::addmm", "cpu_op"), ("aten::add", "cpu_op"), ("aten::item", "cpu_op"),
    ("aten::_local_scalar_dense", "cpu_op"), ("aten::copy_", "cpu_op"), ("aten::contiguous", "cpu_op"),
    ("aten::empty", "cpu_op"), ("aten::_foreach_add_", "cpu_op"), ("MmBackward0", "cpu_op"),
    ("autograd::engine::evaluate_function: MmBackward0", "cpu_op"), ("Optimizer.step#SGD.step", "user_annotation"),
    ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation"),
    ("## forward ##", "user_annotation"), ("entire_frame_compile", "user_annotation"),
    ("train.py(3): step", "python_function"), ("site-packages/lib/mod.py(1): f", "python_function"),
    ("site-packages/lib/inner.py(2): g", "python_function"),
]


_RUNTIME = [("cudaLaunchKernel", "cuda_runtime"), ("cuLaunchKernel", "cuda_driver"),
            ("cudaMemcpyAsync", "cuda_runtime"), ("cudaStreamSynchronize", "cuda_runtime"), ("cudaFree", "cuda_runtime"), ("cuInit", "cuda_driver")]
_DEVICE = [("gemm_kernel", "kernel"), ("other_kernel", "kernel"), ("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy"),
           ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy"), ("Memset (Device)", "gpu_memset")]


class _Ids:
    """Increasing ids as kineto writes them: an op's External id, a runtime call's CUPTI correlation id."""

    def __init__(self):
        self.op, self.call = 0, 0


def _random_trace(rng, device: bool = False) -> list[dict]:
    """Steps of randomly nested events on two threads, in a shuffled or kept file order, times rounded to the
    ns as kineto writes them, children now and then outliving their parent by a ns, memory records among them;
    with ``device``, ops on a third thread (tid 0), runtime calls (some on an OS thread id of their own, some slow
    enough to be a one-time cost, some outside any op) and the kernels, copies and memsets they launch on two
    streams (some lost, some never launched in the trace, some stamped before their launch)."""
    events, t, ids = [], rng.uniform(0, 1e6), _Ids()

    def call(at: float, end: float, tid: int, op: int) -> None:
        name, cat = rng.choice(_RUNTIME)
        ids.call += 1
        dur = round(rng.uniform(0, end - at), 3)
        links = {"correlation": ids.call, "External id": op if rng.random() < 0.9 else rng.randint(0, ids.op)}
        events.append(event(name, round(at, 3), dur, cat=cat, tid=tid if rng.random() < 0.5 else 10 + tid, **links))
        if rng.random() < 0.85:
            kernel, kind = rng.choice(_DEVICE)
            skew = rng.uniform(-50, 0) if rng.random() < 0.1 else rng.uniform(0, 3 * (dur + 1))  # clocks apart
            events.append(event(kernel, round(at + skew, 3), round(rng.uniform(0, 20), 3), cat=kind,
                                tid=rng.choice([7, 8]), **links))
        if rng.random() < 0.05:  # a kernel whose launch is not in the trace
            events.append(event("lost_kernel", round(at, 3), 1.0, cat="kernel", tid=7,
                                correlation=ids.call + rng.choice([0, 100]), **{"External id": op}))

    def children(start: float, end: float, depth: int, op: int = 0) -> None:
        at = start
        while depth < 6 and at < end and rng.random() < 0.7:
            if device and rng.random() < 0.3:
                call(at, end, rng.choice([1, 1, 2]), op)
                at = round(at + rng.uniform(0, end - at), 3)
                continue
            name, cat = rng.choice(_VOCABULARY)
            dur = round(rng.uniform(0, (end - at) * 0.8), 3) + (0.001 if rng.random() < 0.1 else 0.0)
            ids.op += 1
            args = {"Sequence number": rng.randint(-1, 5), "External id": ids.op}
            if name in ("aten::mm", "aten::addmm") and rng.random() < 0.7:
                args.update({"Input type": [rng.choice(["float", "c10::BFloat16", "c10::Half"])] * 2,
                             "Input Dims": [[rng.choice([4, 8]), 4], [4, rng.choice([4, 3])]]})
            tid = rng.choice([1, 1, 1, 2] + ([0] if device else []))  # 0: a falsy id the linking reads past
            events.append(event(name, round(at, 3), round(dur, 3), cat=cat, tid=tid, **args))
            if rng.random() < 0.2:
                events.append(_memory(round(at + dur / 2, 3), rng.choice([64, -64, 4096]), rng.choice([0, 1])))
            children(at, at + dur, depth + 1, ids.op if cat == "cpu_op" else op)
            at = round(at + dur + rng.choice([0.0, 0.0, 0.5, 2.0]), 3)

    for number in range(rng.randint(0, 4)):
        length = round(rng.uniform(50, 500) * (100 if device and rng.random() < 0.3 else 1), 3)  # long: slow calls
        events.append(_step(number + 1, round(t, 3)) | {"dur": length})
        children(t, t + length, 0)
        t += length + rng.choice([0.0, 1.0])
    children(t, t + 100, 1)  # after the steps
    if rng.random() < 0.5:
        rng.shuffle(events)
    return events


def _assert_random(path: str, events: list[dict]) -> None:
    """The columnar summary is the sweep's, whole and in groups of one step (where the events path takes them)."""
    _assert_same(path)
    if sum(e["name"].startswith("ProfilerStep#") for e in events) >= 2:
        columnar, swept = _both(path, 1)
        if swept is not None:  # the events path refuses groups far heavier than the average
            for f in dataclasses.fields(TraceSummary):
                assert_same(getattr(columnar, f.name), getattr(swept, f.name), f.name, ordered=True)


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
@hypothesis.given(seed=hypothesis.strategies.integers(0, 2**32 - 1))
def test_random_traces(tmp_path_factory, seed):
    """The columnar summary is the sweep's on random host-only traces, whole and in groups of one step."""
    import random
    events = _random_trace(random.Random(seed))
    if any(e.get("ph") == "X" for e in events):
        _assert_random(str(write_trace(tmp_path_factory.mktemp("random") / "t.json", events)), events)


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
@hypothesis.given(seed=hypothesis.strategies.integers(0, 2**32 - 1))
def test_random_traces_with_device_work(tmp_path_factory, seed):
    """... and on random traces of runtime calls and the device work they launch."""
    import random
    events = _random_trace(random.Random(seed), device=True)
    if any(e.get("ph") == "X" for e in events):
        _assert_random(str(write_trace(tmp_path_factory.mktemp("random") / "t.json", events)), events)


GPU = os.path.join(os.path.dirname(__file__), "..", "..", "data", "gpu")
_DEVICE_TRACES = [os.path.join(GPU, name) for name in sorted(os.listdir(GPU)) if name.endswith(".json.gz")] + [
    os.path.join(DATA, name) for name in sorted(os.listdir(DATA))
    if name.endswith(".json.gz") and not name.startswith("hta_cpu_")] + [
    os.path.join(DATA, "hta_sampled_job", name) for name in sorted(os.listdir(os.path.join(DATA, "hta_sampled_job")))]


@pytest.mark.trace_files
@pytest.mark.parametrize("path", _DEVICE_TRACES, ids=os.path.basename)
def test_real_traces_with_device_work(path):
    """Every trace of device work in tests/data, whole and (where it has steps) in groups of one and of two steps:
    the H200 captures (autocast, compile, CUDA graphs, explicit syncs, fp32), HTA's and kineto's public traces
    (a host ahead of its GPU, NCCL, ROCm, MTIA, earlier schemas, templated kernel names cut, sampled ranks)."""
    summary = _assert_same(path)
    if summary.steps > 1:
        _assert_same(path, steps_per_group=1)
        _assert_same(path, steps_per_group=2)
