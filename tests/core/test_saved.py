"""result.save(path) and torchmagic.load(path): every kind of result comes back the same plain data,
shown the same; a file that holds none is one line."""

import gzip
import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchmagic
from torchmagic.core.devices import DeviceInfo
from torchmagic.core.expectations import Expectation
from torchmagic.core.render.saved import NotAResultFile
from torchmagic.features.profile.result import Finding, ProfileResult, Severity

from ..fakes import FakeCudaDevice

GPU_TRACE = Path(__file__).parent.parent / "data" / "gpu" / "fp32_training.json.gz"
MiB = 2**20


def _results():
    model, x = torch.nn.Linear(64, 64), torch.randn(8, 64)
    before = torchmagic.profile(lambda: model(x).sum().backward(), steps=4)
    after = torchmagic.profile(lambda: model(x).sum().backward(), steps=4)
    device = FakeCudaDevice(capacity_bytes=2**30)
    yield before  # ProfileResult: findings with expectations, ops, timeline, options
    yield torchmagic.diff(before, after)
    yield torchmagic.analyze(str(GPU_TRACE))  # a real H200 trace: kernels, streams, findings
    yield torchmagic.autobatch(lambda bs: (device.allocate(MiB * bs), device.free(MiB * bs)), device=device,
                               restore=[])
    yield torchmagic.compare(lambda m: m(x).sum(), model=model)
    yield torchmagic.measure_memory(lambda: torch.ones(1024))
    yield torchmagic.loadertune(DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8), workers=[0], batches=4)


@pytest.mark.slow  # 4-11 s: the fast lane (-m "not slow") stays under 5 minutes
def test_every_kind_of_result_comes_back_the_same(tmp_path):
    for i, result in enumerate(_results()):
        path = result.save(tmp_path / f"{i}.json.gz" if i % 2 else tmp_path / f"{i}.json")
        loaded = torchmagic.load(path)
        assert type(loaded) is type(result)
        assert loaded.to_json() == result.to_json() and loaded.to_text() == result.to_text(), type(result).__name__


def test_a_finding_comes_back_as_it_was_saved(tmp_path):
    # rebuilt from its fields' types: its severity an enum, its expectation a dataclass
    finding = Finding(rule="amp", severity=Severity.MEDIUM, title="fp32 matmuls", evidence={"share_of_step": 0.2},
                      fix="Autocast.", snippet="with torch.autocast('cpu'):", verify="%%amp_compare --expect 1.10-1.30",
                      share=0.2, expected=Expectation(1.1, 1.3, "measured"))
    result = ProfileResult(label="%%torchprofile", device=DeviceInfo("cpu", "cpu", "cpu"), step_s=[0.01], findings=[finding])
    loaded = torchmagic.load(result.save(tmp_path / "finding.json"))
    assert loaded == result and type(loaded.findings[0].severity) is Severity
    assert type(loaded.findings[0].expected) is Expectation


def test_a_file_that_holds_no_result_is_one_line(tmp_path):
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json.gz").write_bytes(b"not gzip")
    (tmp_path / "text.json").write_text("not json")
    later = {"format": "torchmagic-result", "version": 2, "type": "ProfileResult", "result": {}}
    (tmp_path / "later.json").write_text(json.dumps(later))
    with gzip.open(tmp_path / "unknown.json.gz", "wt") as f:
        json.dump({**later, "version": 1, "type": "SomethingElse"}, f)
    for name, message in (("trace.json", "not a result saved by torchmagic"), ("list.json", "not a result saved"),
                          ("broken.json.gz", "Not a gzipped file"), ("text.json", "Expecting value"),
                          ("later.json", "saved in format version 2; this torchmagic reads version 1"),
                          ("unknown.json.gz", "holds a result of type SomethingElse"),
                          ("missing.json", "No such file or directory")):
        with pytest.raises(NotAResultFile) as raised:
            torchmagic.load(tmp_path / name)
        assert str(raised.value).startswith(f"{tmp_path / name}: ") and message in str(raised.value)
        assert "\n" not in str(raised.value) and isinstance(raised.value, ValueError)


# Files the earlier versions wrote: the options of a comparison and a sweep as plain dicts (the
# expectation as its text), the device as the dict Device.describe() returned (a GPU's with its uuid
# and why it was chosen; the ranks engine's without a label).
_EARLIER = {
    "CompareResult": {
        "label": "step", "device": {"kind": "cuda", "label": "cuda:0", "name": "NVIDIA H100", "chosen": "as given",
                                    "uuid": "GPU-1234", "later": "a key no version reads"},
        "variants": [{"name": "eager", "median_s": 0.01, "speedup": 1.0}, {"name": "amp", "median_s": 0.008}],
        "rounds": 4, "options": {"variants": ["eager", "amp"], "runs": None, "min_time": 1.0, "min_rounds": 10,
                                 "warmup": 3, "dtype": None, "atol": None, "rtol": None, "restore": True,
                                 "expect": "1.15-1.30x"}},
    "LoaderTuneResult": {
        "label": "loader", "device": {"kind": "cpu", "label": "cpu", "name": "Test CPU"},
        "current": {"num_workers": 0}, "best": {"num_workers": 0}, "fastest": {"num_workers": 0}, "rows": [],
        "speedup": None, "ci": None, "seconds": 1.0, "cpus": 2, "start_method": "fork",
        "loader_call": "DataLoader(dataset)",
        "options": {"workers": [0, 1, 2], "batches": None, "seconds": 0.5, "rounds": 6, "expect": None}},
    "AutobatchResult": {
        "label": "step", "device": {"kind": "ranks", "name": "2 ranks"}, "batch_size": None, "budget_bytes": 0,
        "limit_bytes": 0, "budget_source": "not read: nothing ran", "fixed_bytes": None, "per_sample_bytes": None,
        "ranks": 2, "options": {"margin": 0.1}},
}


def test_a_file_an_earlier_version_wrote_still_loads(tmp_path):
    for kind, data in _EARLIER.items():
        path = tmp_path / f"{kind}.json"
        path.write_text(json.dumps({"format": "torchmagic-result", "version": 1, "type": kind, "torchmagic": "0.1.0",
                                    "result": data}))
        loaded = torchmagic.load(path)
        assert type(loaded).__name__ == kind and loaded.to_text()
        assert torchmagic.load(loaded.save(tmp_path / f"{kind}.again.json")).to_json() == loaded.to_json()
    compare = torchmagic.load(tmp_path / "CompareResult.json")
    assert compare.device == DeviceInfo("cuda", "cuda:0", "NVIDIA H100", chosen="as given", uuid="GPU-1234")
    assert compare.options.variants == ("eager", "amp") and compare.options.expect == Expectation(1.15, 1.30)
    assert "Not judged against the 1.15-1.30x the finding predicted" in compare.to_text()
    tuned = torchmagic.load(tmp_path / "LoaderTuneResult.json")
    assert tuned.options.workers == (0, 1, 2) and tuned.options.rounds == 6 and tuned.options.expect is None
    ranked = torchmagic.load(tmp_path / "AutobatchResult.json")
    assert ranked.device == DeviceInfo("ranks", "ranks", "2 ranks") and ranked.options.margin == 0.1
