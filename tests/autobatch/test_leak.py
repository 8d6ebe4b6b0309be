"""A step that keeps memory from call to call (a leak): %autobatch says so and stops, on CPU and on the fake
GPU, through the real magic and its Python twin; memory a step makes once, or once per size, is no leak."""

import pytest
import torch
from torch import nn

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.features.autobatch.leak import LEAK_RUNS
from torchmagic.features.autobatch.magic import AutobatchMagics
from torchmagic.features.autobatch.search import TRIAL_STEPS

from ..conftest import run
from ..fakes import FakeCudaDevice

KiB, MiB = 2**10, 2**20
PER_SAMPLE = 256 * KiB  # what the leaking steps keep of each sample, every call

# As reported (issue 51): 256 KiB per sample kept in the user's list on every call.
CPU_LEAK = """
import torch
sentinel = torch.arange(10.0)
kept = [sentinel]
def step(bs):
    x = torch.randn(bs, 64 * 1024)
    kept.append(x.clone())
    (x * 2).sum()
"""


def _leak_figures_hold(r, budget: int) -> None:
    """The result says where and how much the held memory grew, and the search stopped there."""
    assert r.leak is not None and r.leak.runs >= LEAK_RUNS
    assert abs(r.leak.per_sample_bytes - PER_SAMPLE) <= 0.25 * PER_SAMPLE
    assert r.leak.per_call_bytes == pytest.approx(r.leak.per_sample_bytes * r.leak.batch_size, rel=0.01)
    real = [t for t in r.trials if not t.estimated]
    assert real[-1].leaked and real[-1].batch_size == r.leak.batch_size  # the last trial run: where it was seen
    assert len(real) <= 2  # stopped at once (the unchecked search ran 8 trials, holding 12x the budget)
    assert r.batch_size is None or (r.answer_trial.ok and r.answer_trial.peak_bytes <= r.limit_bytes <= budget)
    for view in (r.to_text(), r.to_html()):
        assert "Memory leak" in view and "per sample" in view and "not be trustworthy" in view
        assert ".item()" in view and "largest size verified" in view.lower()


def test_the_magic_says_a_step_leaks_and_stops_on_cpu(shell):
    shell.run_cell(CPU_LEAK)
    result, captured = run(shell, "%autobatch -o r --budget 64MiB step")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    kept = shell.user_ns["kept"]
    assert kept[0] is shell.user_ns["sentinel"] and torch.equal(kept[0], torch.arange(10.0))  # the user's list,
    assert all(t.shape == (t.shape[0], 64 * 1024) for t in kept[1:])  # grown by the step's calls alone
    held = sum(t.numel() * t.element_size() for t in kept[1:])
    assert held <= 64 * MiB  # the unchecked search left 806 MiB in it against this 64 MiB budget
    assert "Memory leak: at batch" in captured.stdout and "Largest batch size that fits" not in captured.stdout
    _leak_figures_hold(r, 64 * MiB)

    twin = torchmagic.autobatch(shell.user_ns["step"], budget=64 * MiB, device=CpuDevice())
    _leak_figures_hold(twin, 64 * MiB)
    assert (twin.leak.batch_size, twin.batch_size) == (r.leak.batch_size, r.batch_size)


def test_a_metric_kept_with_its_graph_is_a_leak_seen_past_the_first_size():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scores = []

    def step(bs):
        x = torch.randn(bs, 256)
        loss = model(x).logsumexp(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        scores.append(model(x).amax(1))  # no .detach(), no torch.no_grad(): its graph keeps the activations

    r = torchmagic.autobatch(step, budget=32 * MiB, device=CpuDevice())
    assert r.leak is not None and r.leak.batch_size > 1  # 3 KiB a sample: under the floor at the smallest size
    # what its graph saved, per sample: the input (1 KiB) and the ReLU's output (2 KiB)
    assert 3 * KiB <= r.leak.per_sample_bytes <= 4 * KiB
    assert r.batch_size is not None and r.answer_trial.ok and r.answer_trial.batch_size <= r.leak.batch_size


NO_LEAK = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.Adam(model.parameters())   # its moments are made by each trial's first step
made_once, per_size = {}, {}
def step(bs):
    if "table" not in made_once:                          # a lookup table built on the first call ever
        made_once["table"] = torch.randn(512 * 1024)
    per_size.setdefault(bs, torch.randn(bs, 16 * 1024))  # a workspace for each new shape, kept
    loss = model(torch.randn(bs, 64)).logsumexp(1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_memory_made_once_or_once_per_size_is_no_leak(shell):
    shell.run_cell(NO_LEAK)
    result, captured = run(shell, "%autobatch -o r --budget 16MiB step")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert r.leak is None and not any(t.leaked for t in r.trials)
    assert r.batch_size and r.answer_trial.ok and "Largest batch size that fits" in captured.stdout
    assert "leak" not in r.to_text().lower()


class Activation:
    """Memory on the fake GPU that lives as long as the object, as a tensor's storage does."""

    def __init__(self, device, nbytes):
        self.device, self.nbytes = device, 0  # nothing to free if the allocation runs out of memory
        device.allocate(nbytes)
        self.nbytes = nbytes

    def __del__(self):
        self.device.free(self.nbytes)


GPU_LEAK = """
kept = []
def step(bs):
    work = Activation(device, 4 * 2**20 * bs)             # activations, freed when the step returns
    kept.append(Activation(device, 256 * 2**10 * bs))     # kept by the user's list, every call
"""


def test_the_magic_says_a_step_leaks_on_the_fake_gpu(shell, monkeypatch):
    device = FakeCudaDevice(capacity_bytes=2 * 2**30)
    monkeypatch.setattr(AutobatchMagics, "device", staticmethod(lambda spec, values, magic: device))
    shell.user_ns.update(Activation=Activation, device=device)
    shell.run_cell(GPU_LEAK)
    result, _ = run(shell, "%autobatch -q -o r --budget 1GiB step")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    kept = shell.user_ns["kept"]
    # the magic released all it held: what is left is the user's list, untouched
    assert device.memory_allocated() == sum(a.nbytes for a in kept)
    # its one trial ran 1 + LEAK_RUNS runs: the first, and those that told a leak from a first use
    assert len(kept) == (1 + LEAK_RUNS) * TRIAL_STEPS
    _leak_figures_hold(r, 2**30)
    assert r.leak.per_sample_bytes == PER_SAMPLE  # the fake device counts exactly

    shell.run_cell(GPU_LEAK)  # a fresh list
    twin = torchmagic.autobatch(shell.user_ns["step"], budget=2**30, device=device, restore=[])
    _leak_figures_hold(twin, 2**30)
    assert (twin.leak.batch_size, twin.leak.per_call_bytes) == (r.leak.batch_size, r.leak.per_call_bytes)


def test_a_workspace_made_at_the_first_call_at_each_size_is_no_leak_on_the_fake_gpu():
    device = FakeCudaDevice(capacity_bytes=8 * 2**30)
    workspaces = {}

    def step(bs):
        if bs not in workspaces:  # cuDNN's or a CUDA graph's memory for a new shape, kept
            workspaces[bs] = Activation(device, 64 * MiB + MiB * bs)
        work = Activation(device, 5 * MiB * bs)  # noqa: F841

    r = torchmagic.autobatch(step, budget=0.9, device=device, restore=[])
    assert r.leak is None and r.batch_size and r.answer_trial.ok


def test_a_leak_is_saved_and_loaded_with_the_result(tmp_path):
    device = FakeCudaDevice(capacity_bytes=2**30)
    kept = []

    def step(bs):
        kept.append(Activation(device, PER_SAMPLE * bs))

    r = torchmagic.autobatch(step, budget=512 * MiB, device=device, restore=[])
    assert r.leak is not None
    loaded = torchmagic.load(r.save(tmp_path / "leak.json"))
    assert loaded.leak == r.leak and loaded.trials == r.trials
    assert loaded.to_text() == r.to_text() and loaded.to_dict()["leak"]["per_call_bytes"] == r.leak.per_call_bytes


# the watch, the runs it reads, and the search it stops
LEAK_CODE = tuple(f"features/autobatch/{name}.py" for name in ("leak", "trial", "run"))


def _interrupted_at(shell, source: str, point) -> tuple[bool, str]:
    """Whether a Ctrl-C delivered at ``point`` interrupted the cell (else it ran), and what it showed."""
    from ..checkpoints import run_interrupted_at

    _, (result, captured) = run_interrupted_at(lambda: run(shell, source), point)
    error = result.error_in_exec
    assert error is None or isinstance(error, KeyboardInterrupt), repr(error)
    return error is not None, captured.stdout + captured.stderr


@pytest.mark.slow  # 30-60 s: a search per point
def test_a_ctrl_c_anywhere_on_the_way_to_a_leak_leaves_only_the_users_list(shell, monkeypatch):
    import gc
    import os
    import signal

    from torchmagic.core import interrupts

    from ..checkpoints import describe, points_reached

    device = FakeCudaDevice(capacity_bytes=2 * 2**30)
    monkeypatch.setattr(AutobatchMagics, "device", staticmethod(lambda spec, values, magic: device))
    shell.user_ns.update(Activation=Activation, device=device)
    source = "%autobatch -q -o r --budget 1GiB step"
    package = os.path.dirname(os.path.abspath(torchmagic.__file__))
    shell.run_cell(GPU_LEAK)
    points = points_reached(lambda: run(shell, source), lambda code: code.co_filename.endswith(LEAK_CODE)
                            and code.co_filename.startswith(package))
    assert shell.user_ns["r"].leak is not None and len(points) > 20
    interrupted = 0
    for point in points[::max(len(points) // 30, 1)]:  # about 30 of them, over the whole way
        shell.run_cell(GPU_LEAK)  # a fresh list
        stopped, shown = _interrupted_at(shell, source, point)
        where = f"Ctrl-C at {describe(point, package)}"
        interrupted += stopped
        assert "torchmagic/" not in shown, where
        gc.collect()
        left = device.memory_allocated() - sum(a.nbytes for a in shell.user_ns["kept"])
        # nothing of torchmagic's; a step a Ctrl-C stopped keeps its own activation (4 MiB at batch 1) in the
        # frame its traceback holds, as an interrupted cell's locals are kept
        assert left == 0 or (stopped and left == 4 * MiB), f"{where}: {left} bytes left"
        assert gc.isenabled() and signal.getsignal(signal.SIGINT) is signal.default_int_handler, where
        assert not interrupts.is_guarded() and gc.get_freeze_count() == 0, where
    assert interrupted >= 10


class Unread(FakeCudaDevice):
    """A device whose held memory cannot be read exactly (a CPU without glibc's mallinfo2)."""

    def memory_held(self):
        return None


def test_where_held_memory_cannot_be_read_nothing_is_called_a_leak():
    device = Unread(capacity_bytes=2**30)
    kept = []

    def step(bs):
        kept.append(Activation(device, PER_SAMPLE * bs))

    r = torchmagic.autobatch(step, budget=512 * MiB, device=device, restore=[])
    assert r.leak is None and not any(t.leaked for t in r.trials)
    assert len([t for t in r.trials if not t.estimated]) > 2  # the search went on, as it did before
