"""%loadertune and torchmagic.loadertune with real DataLoaders and worker processes."""

import time

import psutil
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, SubsetRandomSampler

import torchmagic
from torchmagic.features.loadertune.options import default_workers
from torchmagic.features.loadertune.result import LoaderSettings, LoaderTuneResult

from ..conftest import run

# CPU batches: on a GPU machine whose CUDA is in use the sweep would add pinned memory
CPU = "cpu"


class Tokenising(Dataset):
    """A GIL-bound per-item transform, like pure-Python tokenising: workers can run it in parallel."""

    def __init__(self, n=2048, work=6000):
        self.n, self.work = n, work

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        h = 0
        for k in range(self.work):
            h = (h * 31 + k + i) % 1_000_003
        return torch.tensor([float(h % 97)]), i % 2


class Reading(Dataset):
    """Items that take ``wait_s`` each without using the CPU, like reading them from disk."""

    def __init__(self, n=1024, wait_s=0.002):
        self.n, self.wait_s = n, wait_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.wait_s)
        return torch.tensor([float(i)]), i % 2


class Failing(Tokenising):
    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            raise ValueError(f"item {i} is corrupt")
        return super().__getitem__(i)


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(10_000):
            yield torch.tensor([float(i)])


class Transformed(Dataset):
    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return 256

    def __getitem__(self, i):
        return self.transform(torch.tensor([float(i)]))


def children() -> list[str]:
    """This process's children, each as pid, start time and command line (what a leak needs to be found)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            command = " ".join(child.cmdline())
            found.append(f"{child.pid} started {child.create_time():.0f}: {command[:200]}")
        except psutil.Error:  # it exited while being read: not left behind
            continue
        if "multiprocessing.resource_tracker" in command:
            # Python's own helper, one per process, started at the first spawn-context lock
            # (a spawn DataLoader after torch.compile has run) and kept by design until exit
            found.pop()
    return found


@pytest.mark.slow
def test_workers_are_recommended_for_a_slow_reading_dataset_with_a_ci_excluding_one():
    # items that wait (reading files, decoding over the network): two workers halve the wait on
    # any machine, busy or not, where a CPU-heavy transform gains nothing when the cores are taken
    loader = DataLoader(Reading(n=256, wait_s=0.002), batch_size=16, shuffle=True)  # 16 batches an epoch
    rng = torch.get_rng_state()
    r = torchmagic.loadertune(loader, workers=[0, 2], seconds=0.25, rounds=6, device=CPU)
    assert isinstance(r, LoaderTuneResult) and r.current == LoaderSettings(0)
    assert r.best.num_workers == 2 and r.speedup > 1 and r.ci[0] > 1, r.to_text()
    assert r.headline().startswith("Set num_workers=2") and "num_workers=2" in r.loader_call
    assert r.loader_call.startswith("DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2")
    two = r.row(LoaderSettings(2, False, True, 2))
    assert len(two.batches_per_s) >= 6 and two.median_first_batch_s > 0
    fresh = r.row(LoaderSettings(2, False, False, 2))  # workers started every epoch: measured too
    assert r.row(LoaderSettings(2, False, True, 4)) is not None  # and the deeper prefetch
    assert fresh is not None and len(fresh.first_batch_s) == 6
    assert children() == [] and torch.equal(torch.get_rng_state(), rng)  # no workers left, RNG untouched
    assert loader.num_workers == 0 and loader._iterator is None  # the user's loader was never iterated
    data = r.to_dict()
    assert data["changes"]["num_workers"] == 2 and data["rows"][0]["median_batches_per_s"] > 0


def test_an_unpicklable_dataset_under_spawn_gives_the_clear_message_and_no_hang():
    loader = DataLoader(Transformed(lambda t: t * 2), batch_size=8, num_workers=1, multiprocessing_context="spawn")
    r = torchmagic.loadertune(loader, workers=[0, 1], seconds=0.05, rounds=2, device=CPU)
    failed = r.row(r.current)
    assert "cannot be pickled" in failed.error and "if __name__ == \"__main__\":" in failed.error
    assert "lambda" in failed.error and "spawn" in failed.error
    assert r.row(LoaderSettings(0)).batches_per_s and r.best == LoaderSettings(0)
    assert r.headline() == "Set num_workers=0: the current settings (num_workers=1, prefetch_factor=2) fail (below)"
    assert children() == []


def test_an_unpicklable_dataset_under_fork_still_runs_but_warns_about_macos_and_windows():
    loader = DataLoader(Transformed(lambda t: t * 2), batch_size=8, num_workers=1, multiprocessing_context="fork")
    r = torchmagic.loadertune(loader, workers=[0, 1], seconds=0.05, rounds=2, device=CPU)
    assert r.row(LoaderSettings(1, False, True, 2)).batches_per_s
    assert any("on macOS and Windows" in note for note in r.notes)


def test_a_crashing_worker_fails_its_setting_and_the_rest_goes_on():
    loader = DataLoader(Failing(n=64, work=10), batch_size=4)
    r = torchmagic.loadertune(loader, workers=[0, 2], seconds=0.05, rounds=2, device=CPU)
    assert "item" in r.row(LoaderSettings(2, False, True, 2)).error
    assert r.row(LoaderSettings(0)).batches_per_s and r.best == r.current
    assert children() == []


def test_iterable_datasets_and_custom_samplers():
    r = torchmagic.loadertune(DataLoader(Stream(), batch_size=32), workers=[0, 1], seconds=0.05, rounds=2, device=CPU)
    assert r.row(LoaderSettings(0)).batches_per_s and any("IterableDataset" in n for n in r.notes)
    sampler = SubsetRandomSampler(range(0, 200, 2))
    loader = DataLoader(Tokenising(n=200, work=10), batch_size=5, sampler=sampler)
    r = torchmagic.loadertune(loader, workers=[0, 1], seconds=0.05, rounds=2, device=CPU)
    assert all(row.error is None for row in r.rows) and "sampler=sampler" in r.loader_call
    assert children() == []


def test_with_a_training_step_the_bottleneck_is_named_and_the_model_restored():
    torch.manual_seed(0)
    model = nn.Linear(1, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()

    def step(batch):
        x, y = batch
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    loader = DataLoader(Tokenising(n=512, work=2000), batch_size=16)
    r = torchmagic.loadertune(loader, workers=[0, 2], seconds=0.1, rounds=2, step=step, device=CPU)
    assert r.step_s > 0 and set(r.with_step) == {"current", "best"}
    assert "the bottleneck is the loader" in r.to_text()
    assert torch.equal(model.weight, before) and children() == []


def test_default_workers_and_bad_options():
    assert default_workers(2) == (0, 1, 2) and default_workers(12) == (0, 1, 2, 4, 8, 12)
    for kwargs, message in [({"workers": [-1]}, "0 or more"), ({"batches": 0}, "at least 1"),
                            ({"seconds": 0}, "positive"), ({"rounds": 1}, "at least 2")]:
        with pytest.raises(ValueError, match=message):
            torchmagic.loadertune(DataLoader(Stream()), **kwargs)
    with pytest.raises(ValueError, match="expected a DataLoader or a dataset"):
        torchmagic.loadertune(42)


# --- the magic ---------------------------------------------------------------------------


def test_magic_on_a_loader_and_on_a_dataset_with_arguments(shell):
    shell.user_ns.update(loader=DataLoader(Stream(), batch_size=16), ds=Tokenising(n=128, work=10), pad=None)
    result, captured = run(shell, "r = %loadertune loader --workers 0,1 --seconds 0.05 --rounds 2")
    assert result.success, result.error_in_exec
    r = shell.user_ns["r"]
    assert isinstance(r, LoaderTuneResult) and captured.outputs == []
    assert r.ci is None and r.best == r.current  # 2 rounds: no interval, so no change is recommended
    assert any("no confidence interval" in note for note in r.notes)
    result, captured = run(shell, "%loadertune ds batch_size=8 shuffle=True collate_fn=pad --workers 0 "
                                  "--seconds 0.05 --rounds 2")
    assert result.success and "batch_size=8, shuffle=True" in result.result.loader_call
    assert children() == []


@pytest.mark.parametrize("line, message", [
    ("nothere", "'nothere' is not defined"),
    ("number", "expected a DataLoader or a dataset, got a int"),
    ("loader --workers two", "--workers takes counts such as 0,1,2,4"),
    ("loader --batches 0", "--batches must be at least 1"),
    ("loader --rounds 1", "at least 2"),
    ("loader --step nothere", "--step 'nothere' is not a function"),
    ("loader batch_size=4", "keyword arguments go with a dataset"),
    ("ds batch_size", "written key=value"),
    ("ds batch_size=oops", "neither a Python literal nor a defined name"),
    ("ds batch_size=-3", "DataLoader refused the arguments"),
    ("-o 1x loader", "-o needs a Python variable name"),
])
def test_bad_arguments_give_a_one_line_usage_error(shell, line, message):
    shell.user_ns.update(loader=DataLoader(Stream()), ds=Tokenising(n=8, work=1), number=3)
    result, captured = run(shell, f"%loadertune {line}")
    text = captured.stderr + captured.stdout
    assert message in text and "Traceback" not in text and len(text.strip().splitlines()) == 1


class Augmented(Dataset):
    """Items flipped at random with Python's own generator, as hand-written augmentations often are."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        import random
        item = torch.full((4,), float(i))
        return item.flip(0) if random.random() < 0.5 else item


def _pipes() -> int:
    import os
    fds = os.listdir("/proc/self/fd")
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") for fd in fds
               if os.path.exists(f"/proc/self/fd/{fd}"))


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/fd"), reason="reads /proc")
def test_an_interrupted_sweep_kept_in_a_traceback_holds_no_pipe_and_puts_the_generators_back():
    # IPython keeps the last traceback: an interrupt that passed through a pass with a worker running
    # kept its iterator's queues and the worker's sentinel (+4 pipes a run), and Python's generator,
    # which the workers=0 pass drew from, was not put back
    import random
    import signal
    import sys
    from torchmagic.features.loadertune import run as loadertune_run

    loader = DataLoader(Augmented(), batch_size=8)
    code = loadertune_run._Tuner._steady.__code__
    kept = []
    random.seed(3)
    python_rng, pipes = random.getstate(), _pipes()
    for _ in range(3):
        passes = []

        def tracer(frame, event, arg):  # a Ctrl-C in the second pass (1 worker), once its iterator runs
            if frame.f_code is code and event == "call":
                passes.append(frame)
                if len(passes) == 2:
                    signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)
            return None

        sys.settrace(tracer)
        try:
            with pytest.raises(KeyboardInterrupt) as caught:
                torchmagic.loadertune(loader, workers=[0, 1], rounds=2, batches=2, device=CPU)
        finally:
            sys.settrace(None)
        kept.append(caught.value)  # as IPython keeps sys.last_value
        assert random.getstate() == python_rng, "Python's random generator was not put back"
    assert _pipes() <= pipes, f"pipes grew from {pipes} to {_pipes()} with the interrupts kept"
