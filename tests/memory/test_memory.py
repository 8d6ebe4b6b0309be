"""Memory attribution, freeing and watching, on real CPU tensors; GPUs through the fake device."""

import gc
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import torchmagic
from torchmagic.core.devices import NvmlProcess, NvmlReading
from torchmagic.features.memory.free import free
from torchmagic.features.memory.report import memory_report
from torchmagic.features.memory.run import run_cell_memory
from torchmagic.features.memory.watch import MemoryWatch

from ..fakes import FakeCudaDevice

MiB = 2**20


def rows_by_name(result):
    return {(v.name, v.device): v for v in result.variables}


def test_views_and_tied_weights_count_once():
    base = torch.zeros(MiB // 4)  # 1 MiB
    emb = nn.Embedding(256, 64)
    head = nn.Linear(64, 256, bias=False)
    head.weight = emb.weight  # tied
    tied = nn.ModuleDict({"emb": emb, "head": head})
    ns = {"base": base, "view": base[10:20], "also": [base, base.view(2, -1)], "tied": tied}
    r = memory_report(ns, devices=[])
    rows = rows_by_name(r)
    assert rows[("base", "cpu")].bytes == MiB and rows[("view", "cpu")].bytes == MiB
    assert rows[("also", "cpu")].bytes == MiB and rows[("also", "cpu")].tensors == 2
    assert rows[("base", "cpu")].shared_bytes == MiB  # other variables reach the same storage
    assert rows[("tied", "cpu")].bytes == 256 * 64 * 4 and rows[("tied", "cpu")].shared_bytes == 0
    assert r.host["variables_bytes"] == MiB + 256 * 64 * 4  # the union, each storage once


def test_modules_and_optimizers_are_followed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.BatchNorm1d(256), nn.Linear(256, 8))
    model.cache = torch.zeros(1000)  # a plain tensor attribute
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 128)).sum().backward()
    opt.step()
    params = sum(p.numel() for p in model.parameters()) * 4
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    r = memory_report({"model": model, "opt": opt}, devices=[])
    rows = rows_by_name(r)
    assert rows[("model", "cpu")].bytes == 2 * params + buffers + 4000  # weights, grads, buffers, the cache
    assert rows[("opt", "cpu")].bytes == 2 * params + 6 * 4  # exp_avg, exp_avg_sq, a step count per parameter
    assert rows[("model", "cpu")].type == "Sequential"


def test_nothing_of_the_users_code_runs_while_walking():
    class Booby:
        __slots__ = ("tensor",)

        def __getattr__(self, name):
            raise AssertionError("__getattr__ ran")

        def __getattribute__(self, name):
            if name != "__class__":
                raise AssertionError("__getattribute__ ran")
            return object.__getattribute__(self, name)

    class Lazy:
        @property
        def expensive(self):
            raise AssertionError("a property ran")

    class Sneaky(dict):
        def values(self):
            raise AssertionError("an overridden method ran")

    trap = Booby.__new__(Booby)
    Booby.tensor.__set__(trap, torch.zeros(100))
    lazy = Lazy()
    lazy.t = torch.zeros(50)
    r = memory_report({"trap": trap, "lazy": lazy, "sneaky": Sneaky(a=torch.zeros(25))}, devices=[])
    rows = rows_by_name(r)
    assert rows[("trap", "cpu")].bytes == 400 and rows[("lazy", "cpu")].bytes == 200
    assert rows[("sneaky", "cpu")].bytes == 100


def test_slotted_dataclasses_named_tuples_and_sets():
    @dataclass(slots=True)
    class Batch:
        x: torch.Tensor
        y: torch.Tensor

    t = torch.zeros(10)
    r = memory_report({"batch": Batch(torch.zeros(100), torch.zeros(10)), "s": {t}, "fs": frozenset([t])}, devices=[])
    rows = rows_by_name(r)
    assert rows[("batch", "cpu")].bytes == 440 and rows[("s", "cpu")].bytes == 40


def test_cycles_and_huge_containers_are_walked_in_bounded_time():
    loop: list = []
    loop.append(loop)
    loop.append(torch.zeros(10))
    deep: list = [torch.zeros(1)]
    for _ in range(10_000):
        deep = [deep]
    huge = [torch.zeros(1) for _ in range(200_000)]
    start = time.perf_counter()
    r = memory_report({"loop": loop, "deep": deep, "huge": huge}, devices=[])
    assert time.perf_counter() - start < 5
    rows = rows_by_name(r)
    assert rows[("loop", "cpu")].bytes == 40
    assert ("deep", "cpu") not in rows  # the tensor is deeper than the walk goes
    assert rows[("huge", "cpu")].partial and rows[("huge", "cpu")].tensors == 10_000
    assert "partly walked" in r.to_text()


def test_history_variables_are_skipped_but_their_memory_is_reported():
    pinned = torch.zeros(MiB // 4)
    ns = {"_": pinned, "_5": pinned, "Out": {5: pinned}, "_i5": "pinned", "x": torch.zeros(4)}
    r = memory_report(ns, devices=[])
    assert [v.name for v in r.variables] == ["x"]
    assert r.pinned == {"history": {"cpu": MiB}}
    assert "IPython's output history (Out, _, __, _N) holds 1.0 MiB" in r.to_text()


def test_free_really_frees_and_drops_the_history_and_the_traceback():
    big = torch.zeros(4 * MiB)
    ref = weakref.ref(big)
    ns = {"big": big, "keep": torch.ones(3), "Out": {3: big}, "_3": big, "_": big, "__": "text"}
    try:
        def failing(t):
            raise ValueError("boom")
        failing(big)
    except ValueError:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
    del big
    r = free(["big"], ns, devices=[])
    assert ref() is None  # gone, nothing else holds it
    assert "big" not in ns and ns["Out"] == {} and "_3" not in ns and ns["_"] == "" and ns["__"] == "text"
    assert set(r.freed.dropped) == {"Out[3]", "_", "the last traceback"}
    assert sys.last_traceback is None and r.freed.still_alive_tensors == 0
    assert [v.name for v in r.variables] == ["keep"]


def test_free_says_what_is_still_held_elsewhere():
    big = torch.zeros(MiB)
    holder = {"inner": big}
    ns = {"big": big, "elsewhere": [holder]}
    del big
    r = free(["big"], ns, devices=[])
    assert r.freed.still_alive_tensors == 1 and r.freed.still_alive_bytes == 4 * MiB
    assert "still held elsewhere" in r.to_text()
    with pytest.raises(NameError, match="not defined"):
        free(["missing"], ns, devices=[])


def test_cell_reports_a_known_allocation_within_one_percent():
    ns = {}
    run = run_cell_memory(lambda: ns.update(kept=torch.ones(25 * MiB // 4), scratch=None), ns)
    c = run.result.cell
    assert run.error is None and c.device == "cpu"
    assert abs(c.net_bytes - 25 * MiB) <= 0.01 * 25 * MiB and c.peak_bytes >= c.net_bytes
    assert [(v.name, v.bytes) for v in c.new_variables] == [("kept", 25 * MiB)]

    def temporary():
        t = torch.ones(10 * MiB // 4)  # 10 MiB, gone at the end
        return float(t.sum())

    run = run_cell_memory(temporary, {})
    assert abs(run.result.cell.peak_bytes - 10 * MiB) <= 0.01 * 10 * MiB and abs(run.result.cell.net_bytes) < MiB
    assert run.value == 10 * MiB // 4


def test_cell_error_is_returned_with_the_figures():
    def boom():
        x = torch.ones(MiB)  # noqa: F841
        raise RuntimeError("cell failed")

    run = run_cell_memory(boom, {})
    assert isinstance(run.error, RuntimeError) and run.result.cell.peak_bytes >= 4 * MiB


def test_cell_inside_a_running_profiler_reports_net_only():
    with torch.profiler.profile():
        run = run_cell_memory(lambda: None, {})
        assert torch.autograd._profiler_enabled()
    assert run.result.cell.peak_bytes is None and "peak not measured" in run.result.cell.note


def gpu_reading(**overrides):
    fields = dict(name="NVIDIA H100 80GB HBM3", total_bytes=80 * 2**30, used_bytes=10 * 2**30, utilization_pct=93.0,
                  temperature_c=61.0, power_w=412.0,
                  processes=(NvmlProcess(os.getpid(), 7 * 2**30), NvmlProcess(4242, 2 * 2**30)))
    fields.update(overrides)
    return NvmlReading(**fields)


def test_gpu_readings_and_the_nvml_torch_gap_explained():
    dev = FakeCudaDevice(nvml=gpu_reading())
    dev.allocate(5 * 2**30)
    dev.free(1 * 2**30)  # 4 GiB allocated, 5 GiB reserved: 1 GiB cached
    r = memory_report({}, devices=[dev])
    d = r.devices[0]
    assert (d.allocated_bytes, d.reserved_bytes, d.peak_bytes) == (4 * 2**30, 5 * 2**30, 5 * 2**30)
    assert d.cached_bytes == 2**30 and d.gap_bytes == 5 * 2**30
    assert d.this_process_bytes == 7 * 2**30 and d.other_processes == [(4242, 2 * 2**30)]
    text = r.to_text()
    assert "cuda:0 Fake H100: 10.0 GiB of 80.0 GiB used (all processes), torch 4.0 GiB allocated, 5.0 GiB reserved" in text
    assert ("NVML used − torch reserved = 5.0 GiB: this process's CUDA context, libraries and memory outside "
            "torch's allocator 2.0 GiB; 1 other process 2.0 GiB (pid 4242 2.0 GiB)") in text
    assert "cached by torch (reserved − allocated, often called fragmentation): 1.0 GiB;" in text
    assert "61 °C · 412 W" in text and d.free_bytes == 70 * 2**30


@pytest.mark.parametrize("reading, expected", [
    ("NVML readings unavailable: nvidia-ml-py is not installed", "nvidia-ml-py is not installed"),
    ("NVML readings unavailable: NVML failed to initialise (Driver Not Loaded)", "failed to initialise"),
    (gpu_reading(processes=None, processes_note="NVML's process list is not visible here (Insufficient Permissions)"),
     "Insufficient Permissions"),
    (gpu_reading(processes=(NvmlProcess(1, 2**30),)), "NVML does not list this process"),
    (gpu_reading(mig=True, utilization_pct=None), "a MIG slice"),
])
def test_every_nvml_problem_gives_a_line_and_the_rest_still_shows(reading, expected):
    dev = FakeCudaDevice(nvml=reading)
    dev.allocate(2**20)
    r = memory_report({"x": torch.zeros(4)}, devices=[dev])
    text = r.to_text()
    assert expected in text and "torch 1.0 MiB allocated" in text and "x" in [v.name for v in r.variables]


def test_without_a_gpu_the_host_is_shown():
    r = memory_report({"x": torch.zeros(MiB // 4)}, devices=[])
    assert r.devices == [] and r.host["rss_bytes"] > 0 and r.host["variables_bytes"] == MiB
    assert r.headline() == "%gpumem: no GPU found; host memory and CPU tensors below"
    assert "no GPU found: torch.cuda.is_available() is False" in r.to_text()


def test_the_watch_starts_samples_stops_and_leaves_nothing_behind():
    dev = FakeCudaDevice(nvml=gpu_reading())
    threads = set(threading.enumerate())
    seen = []
    watch = MemoryWatch([dev], interval=0.02, on_sample=lambda w: seen.append(len(w.samples))).start()
    dev.allocate(3 * 2**20)
    time.sleep(0.3)
    result = watch.stop()
    assert not watch.running and set(threading.enumerate()) == threads and dev.samplers_closed == 1
    assert len(result.samples) >= 5 and seen[:3] == [1, 2, 3]
    assert max(s.devices[0].allocated_bytes for s in result.samples) == 3 * 2**20
    assert result.samples[-1].devices[0].used_bytes == 10 * 2**30
    assert 0 <= result.cpu_seconds < result.seconds
    assert "utilisation mean 93%" in result.to_text() and "<svg" in result.to_html()


def test_a_broken_live_view_does_not_stop_the_sampling():
    def broken(watch):
        raise RuntimeError("widget gone")

    with MemoryWatch([], interval=0.01, on_sample=broken) as watch:
        time.sleep(0.1)
    assert len(watch.samples) >= 3 and "live view stopped updating: widget gone" in watch.result().notes


def test_api_twins():
    ns = {"x": torch.zeros(MiB // 4)}
    assert torchmagic.memory(ns).variables[0].name == "x"
    # the CPU named: on a GPU machine whose CUDA is in use, code with no tensors to go by is measured there
    r = torchmagic.measure_memory(lambda: torch.ones(MiB // 4).sum(), device="cpu")
    assert abs(r.cell.peak_bytes - MiB) <= 0.01 * MiB
    r = torchmagic.free("x", namespace=ns)
    assert r.freed.names == ["x"] and ns == {}
    with torchmagic.watch_memory(0.01) as watch:
        time.sleep(0.05)
    assert watch.result().samples and not watch.running
    gc.collect()


def test_torch_compiles_helper_globals_are_not_listed_as_variables():
    ns = {"x": torch.zeros(4), "__builtins_dict___3": {"t": torch.zeros(1000)}, "__import_torch": torch}
    r = memory_report(ns, devices=[])
    assert [v.name for v in r.variables] == ["x"]
