"""The device follows the data: which device a run measures, and that CPU work never touches CUDA.

CUDA tensors are made as fake tensors (torch's FakeTensorMode), which carry a cuda:N device
without a GPU or a CUDA context.  `cuda_present` makes CUDA look available with two devices while
any call that would initialise it fails, as tests/cuda_unusable does for whole test runs.
"""

import os
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from torchmagic.core.devices import CpuDevice, CudaDevice, choose_device, parse_device

from .fakes import FakeCudaDevice

TESTS = os.path.dirname(os.path.abspath(__file__))

# These tests make a GPU machine out of a CPU one, which takes a CPU build of torch: a CUDA build's
# fake CUDA tensors start CUDA themselves (FakeTensor initialises the device's context). On a GPU
# machine the gpu tier tests the real thing.
pytestmark = pytest.mark.skipif(torch.backends.cuda.is_built(), reason="simulates CUDA on a CPU build of torch")


class CudaTouched(BaseException):
    pass


@pytest.fixture
def cuda_present(monkeypatch):
    """Two CUDA devices that exist but must not be touched: what a CPU model sees on a GPU machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name in ("_lazy_init", "current_device", "synchronize", "mem_get_info", "get_device_properties",
                 "get_device_name", "get_device_capability", "get_rng_state", "set_rng_state"):
        def touched(*args, name=name, **kwargs):
            raise CudaTouched(f"torch.cuda.{name}")
        monkeypatch.setattr(torch.cuda, name, touched)


def fake_tensor(*shape, device):
    with FakeTensorMode():
        return torch.empty(*shape, device=device)


def test_without_a_gpu_the_cpu_is_measured_and_nothing_is_explained():
    device = choose_device(None, [nn.Linear(4, 4)])
    assert isinstance(device, CpuDevice) and device.chosen is None and device.choice_note() is None


def test_a_cpu_model_on_a_gpu_machine_is_measured_on_the_cpu(cuda_present):
    device = choose_device(None, [nn.Linear(4, 4), torch.randn(3, 4)])
    assert isinstance(device, CpuDevice)
    assert device.choice_note().startswith("Measured on cpu (") and "tensors" in device.choice_note()


def test_with_nothing_to_go_by_an_unused_gpu_is_left_alone(cuda_present):
    device = choose_device(None, [print, "text", 3])
    assert isinstance(device, CpuDevice) and "has not used a GPU" in device.chosen


def test_tensors_on_a_gpu_choose_that_gpu_over_cpu_data(cuda_present):
    data = [(torch.randn(8, 4), torch.zeros(8)) for _ in range(3)]  # a CPU dataset, moved per batch
    device = choose_device(None, [data, {"w": fake_tensor(16, 16, device="cuda:1")}])
    assert isinstance(device, CudaDevice) and device.index == 1 and device.label == "cuda:1"
    assert device.chosen == "where the code's tensors are"


def test_among_several_gpus_the_one_holding_most_is_measured_and_the_others_named(cuda_present):
    device = choose_device(None, [fake_tensor(10, device="cuda:0"), fake_tensor(1000, device="cuda:1")])
    assert device.index == 1 and "also on cuda:0: not measured" in device.chosen


def test_module_parameters_and_an_optimizer_count_once(cuda_present):
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert isinstance(choose_device(None, [model, optimizer, [model]]), CpuDevice)


def test_an_explicit_device_wins_and_is_checked(cuda_present):
    assert isinstance(choose_device("cpu", [fake_tensor(4, device="cuda:0")]), CpuDevice)
    assert choose_device("cuda:1").index == 1 and choose_device("cuda:1").chosen == "as given"
    with pytest.raises(ValueError, match="sees 2 CUDA devices"):
        choose_device("cuda:2")
    with pytest.raises(ValueError, match="unknown device"):
        choose_device("gpu0")
    with pytest.raises(ValueError, match="cpu, cuda and mps"):
        choose_device("meta")


def test_an_injected_device_object_keeps_its_reason():
    fake = FakeCudaDevice()
    assert choose_device(fake) is fake and fake.chosen == "as given"


def test_cuda_is_refused_where_there_is_none():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="CUDA is not available"):
        parse_device("cuda")


def test_a_gpu_this_process_has_not_used_is_described_without_initialising_cuda(cuda_present):
    gpu = CudaDevice(1)
    assert gpu.name == "CUDA device 1" or gpu.name  # NVML's name where a driver answers
    assert gpu.uuid() is None and gpu.reset_peak_stats() is False
    assert gpu.memory_allocated() == 0 and gpu.describe().label == "cuda:1"


def test_magic_device_option_errors_are_one_line(shell):
    result = shell.run_cell("%%torchprofile --device tpu\nx = 1")
    assert not result.success and "unknown device 'tpu'" in str(result.error_in_exec)


def test_magics_measure_a_cpu_model_on_the_cpu_when_cuda_is_present(shell, cuda_present):
    shell.run_cell("from torch import nn\nmodel = nn.Linear(32, 32)\nx = torch.randn(64, 32)\n"
                   "def step(bs):\n    model(torch.randn(bs, 32)).sum().backward()")
    runs = {
        "profile": "%%torchprofile -q -o r\ny = model(x).sum()",
        "compare": "%%amp_compare -q -o r --variants eager,amp,int8 --runs 2 --min-time 0.01 --warmup 0\nmodel(x)",
        "autobatch": "%autobatch -q -o r --budget 64MiB --max 256 --no-estimate step",
        "gpumem": "%%gpumem -q -o r\ny = model(x)",
        "loadertune": "%loadertune -q -o r --workers 0 --rounds 2 --seconds 0.02 loader",
    }
    shell.run_cell("from torch.utils.data import DataLoader, TensorDataset\n"
                   "loader = DataLoader(TensorDataset(torch.randn(64, 32)), batch_size=8)")
    for magic, source in runs.items():
        result = shell.run_cell(source)
        assert result.success, (magic, result.error_in_exec)
        r = shell.user_ns["r"]
        assert r.to_dict()["device"]["label"] == "cpu" if magic != "gpumem" else r.cell.device == "cpu"
        if magic == "compare":
            assert all(v.ok for v in r.variants), [v.error for v in r.variants]  # int8 is not refused
            assert r.amp_dtype == "bfloat16"  # autocast("cpu"), not autocast("cuda") around a CPU model
        if magic == "loadertune":
            assert not any(row.settings.pin_memory for row in r.rows)  # pinning would start CUDA
        if magic == "profile":
            assert any("Measured on cpu" in note for note in r.notes)
            assert not any("CPU-only profile" in note for note in r.notes)


@pytest.mark.slow
def test_cpu_tests_and_the_tour_pass_where_cuda_is_present_but_unusable(tmp_path):
    """The tour notebook and %gpumem's tests (every magic's, with TORCHMAGIC_SWEEP=all), run where CUDA
    looks available (two devices) but any call that would initialise it fails: they pass unchanged,
    and nothing touched CUDA."""
    log = tmp_path / "cuda-calls.log"
    env = {**os.environ, "TORCHMAGIC_TEST_CUDA_UNUSABLE": str(log),
           "PYTHONPATH": os.pathsep.join([os.path.join(TESTS, "cuda_unusable"), os.environ.get("PYTHONPATH", "")])}
    # the tour runs every magic; the magics' own tests too with TORCHMAGIC_SWEEP=all (80 s in all on 2 cores)
    every = ["tests/profile/test_magic.py", "tests/test_api.py", "tests/compare/test_compare_magic.py",
             "tests/autobatch/test_autobatch_magic.py"] if os.environ.get("TORCHMAGIC_SWEEP") == "all" else []
    selected = [*every, "tests/memory/test_gpumem_magic.py", "notebooks/00_tour.ipynb",
                # with GPUs present, --reset rightly says they are unused rather than "on the CPU"
                "--deselect", "tests/memory/test_gpumem_magic.py::test_reset_on_cpu_says_there_is_nothing_to_reset"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider",
                           *selected],
                          cwd=os.path.dirname(TESTS), env=env, capture_output=True, text=True, timeout=1500)
    calls = log.read_text() if log.exists() else ""
    assert done.returncode == 0 and not calls, f"CUDA calls: {calls!r}\n{done.stdout[-6000:]}{done.stderr[-2000:]}"


def test_the_second_gpu_is_measured_and_named_as_itself():
    import torchmagic

    second = FakeCudaDevice(index=1, capacity_bytes=2**20)
    r = torchmagic.measure_memory(lambda: second.allocate(4096), device=second)
    assert r.cell.device == "cuda:1" and r.cell.peak_bytes == 4096
    b = torchmagic.autobatch(lambda bs: (second.allocate(bs * 1024), second.free(bs * 1024)), device=second,
                             budget=2**19, max=4096, estimate=False, restore=[])
    assert b.device.label == "cuda:1" and 0 < b.batch_size * 1024 <= 2**19


def test_gpumem_lists_gpus_this_process_has_not_used_without_starting_cuda(cuda_present):
    import torchmagic

    r = torchmagic.memory({"x": torch.randn(4)})
    assert [d.label for d in r.devices] == ["cuda:0", "cuda:1"] and not any(d.in_use for d in r.devices)
    text = r.to_text()
    assert "cuda:0 not used by this process" in r.headline() and "peak allocated" not in text
