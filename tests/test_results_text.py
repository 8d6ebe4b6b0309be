"""Every result prints as its text report (print(r), str(r)) and has a short one-line repr."""

import importlib
import os
import shutil
import tempfile
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchmagic
from torchmagic.core.render.base import Result

from .conftest import run
from .fakes import FakeCudaDevice
from .profile.traces.synthetic import gpu_steps, write_trace

MiB = 2**20
RESULT_MODULES = ["profile.result", "profile.diff", "profile.verify_result", "compare.result", "autobatch.result", "memory.result", "memory.watch_result",
                  "loadertune.result", "profile.traces.result"]


def _profile():
    return torchmagic.profile(lambda: torch.ones(8).add_(1))


def _compare():
    return torchmagic.compare(lambda: torch.ones(8) * 2, variants="eager,inference_mode", runs=2, min_time=0.01,
                              warmup=0)


def _autobatch():
    device = FakeCudaDevice(capacity_bytes=2**30)
    return torchmagic.autobatch(lambda bs: (device.allocate(MiB * bs), device.free(MiB * bs)), budget=64 * MiB,
                                device=device, restore=[], estimate=False)


def _memory():
    return torchmagic.memory({"x": torch.ones(1000)})


def _watch():
    watch = torchmagic.watch_memory(0.01)
    time.sleep(0.05)
    return watch.stop()


def _loadertune():
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4)
    return torchmagic.loadertune(loader, workers=[0], rounds=2, seconds=0.02, batches=3, device="cpu")


def _traces():
    folder = tempfile.mkdtemp()
    for rank in (0, 1):
        write_trace(os.path.join(folder, f"rank{rank}.json"), gpu_steps(late_us=3_000 * rank), rank=rank, world_size=2)
    try:
        return torchmagic.analyze(folder)
    finally:
        shutil.rmtree(folder)


def _diff():
    return torchmagic.diff(_profile(), _profile())


def _verify():
    return torchmagic.profile(lambda: torch.ones(8).add_(1), verify=lambda: torch.ones(8).mul_(2),
                              expect="0.50-2.00").verified


BUILDERS = [_profile, _diff, _verify, _compare, _autobatch, _memory, _watch, _loadertune, _traces]


def _all_result_classes() -> set[type]:
    for module in RESULT_MODULES:
        importlib.import_module(f"torchmagic.features.{module}")
    found, todo = set(), [Result]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub)
            todo.append(sub)
    return found


@pytest.fixture(scope="module")
def results():
    return [build() for build in BUILDERS]


def test_every_kind_of_result_is_covered_here(results):
    assert {type(r) for r in results} == _all_result_classes()


def test_str_is_the_text_report_and_repr_one_short_line(results, capsys):
    for r in results:
        text = r.to_text()
        assert str(r) == text and "\n" in text, type(r)  # the aligned report, not a one-line repr
        print(r)
        assert capsys.readouterr().out == text + "\n"
        summary = repr(r)
        assert summary.startswith(f"<{type(r).__name__}") and summary.endswith(">"), summary
        assert "\n" not in summary and len(summary) <= 200, summary


def test_a_repr_never_dumps_the_fields():
    from torchmagic.features.memory.watch_result import WatchResult, WatchSample

    many = WatchResult(samples=[WatchSample(t=i * 0.1, rss_bytes=MiB, available_bytes=2**30) for i in range(500)],
                       interval_s=0.1, seconds=50.0, cpu_seconds=0.01)
    assert repr(many) == f"<WatchResult: {many.headline()}>"  # not the 500 samples
    assert repr(many).startswith("<WatchResult: %gpumem --watch: watched 50.00 s, 500 samples")


def test_a_repr_survives_a_headline_that_fails():
    class Broken(Result):
        def headline(self):
            raise RuntimeError("no data")

    assert repr(Broken()) == "<Broken>"


def test_a_long_headline_is_cut_in_the_repr():
    from torchmagic.core.render.base import REPR_SUMMARY_CHARS

    class Wordy(Result):
        def headline(self):
            return "word " * 100

    assert repr(Wordy()) == "<Wordy: " + ("word " * 100)[:REPR_SUMMARY_CHARS - 1] + "…>"


def test_print_in_a_notebook_shows_the_report(shell):
    result, captured = run(shell, "r = %gpumem\nprint(r)")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert captured.stdout == r.to_text() + "\n"
    assert captured.stdout.startswith(r.headline())
