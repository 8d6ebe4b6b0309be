"""The prepared GPU capture (benchmarks/gpu_capture.py) runs, so the first session lent a GPU can
spend its minutes on the GPU: here its dry run on the CPU, whose traces torchmagic reads back."""

import json
import os
import tarfile

import torchmagic
from benchmarks import gpu_capture


def test_the_dry_run_writes_traces_torchmagic_reads_back(tmp_path):
    assert gpu_capture.main([str(tmp_path / "out"), "--device", "cpu", "--width", "64", "--batch", "16"]) == 0
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == ["capture.json", "gpu_traces.tar"]
    capture = json.loads((out / "capture.json").read_text())
    assert capture["machine"]["device"] == "cpu"
    assert all("error" not in entry for entry in capture["traces"].values()), capture["traces"]
    assert capture["nvml"] == {"skipped": "no CUDA"} and capture["out_of_memory"] == {"skipped": "no CUDA"}
    with tarfile.open(out / "gpu_traces.tar") as tar:
        tar.extractall(tmp_path / "traces", filter="data")
    names = sorted(os.listdir(tmp_path / "traces"))
    assert names == ["bf16_autocast_training.json.gz", "dataloader_bound.json.gz", "explicit_sync.json.gz",
                     "fp32_training.json.gz"]
    for name in names:
        analysis = torchmagic.analyze(tmp_path / "traces" / name)
        assert analysis.ranks[0].steps == gpu_capture.STEPS, name
    loader = torchmagic.analyze(tmp_path / "traces" / "dataloader_bound.json.gz")
    assert loader.ranks[0].dataloader_s > 0
