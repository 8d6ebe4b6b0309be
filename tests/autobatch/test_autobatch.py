"""torchmagic.autobatch: real CPU steps against a budget, and a fake CUDA device with a known law."""

import gc
import itertools

import pytest
import torch
from torch import nn

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.core.devices.profiler import allocation_peak
from torchmagic.features.autobatch.search import TRIAL_STEPS
from torchmagic.core.measure.stats import upper_prediction_bound
from torchmagic.features.autobatch.footprint import FOOTPRINT_RUNS
from torchmagic.features.autobatch.options import AutobatchOptions
from torchmagic.features.autobatch.run import resolve_budget, run_autobatch
from torchmagic.features.autobatch.search import MAX_ESTIMATES

from ..fakes import FakeCudaDevice
from ..tabs import tabs

MiB = 2**20


def small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10))


def test_cpu_answer_runs_under_budget_and_the_next_size_does_not():
    model = small_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(bs):
        x = torch.randn(bs, 3, 32, 32)
        loss = nn.functional.cross_entropy(model(x), torch.zeros(bs, dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()

    budget = 64 * MiB
    r = torchmagic.autobatch(step, budget=budget, multiple_of=8, device=CpuDevice())
    assert r.batch_size is not None and r.batch_size % 8 == 0
    answer = r.answer_trial
    assert answer.peak_bytes <= r.limit_bytes <= budget  # the answer ran, under the budget
    above = [t for t in r.trials if t.batch_size == r.batch_size + 8]
    assert above and not above[0].ok  # the next multiple does not fit (over the limit or out of memory)
    assert r.per_sample_bytes > 0 and r.fixed_bytes is not None
    # real runs only (Adam cannot run on fake tensors); the process's resident memory, which the
    # limit is for on CPU, varies by a few MiB from run to run near it: a few more trials than a law
    assert sum(not t.estimated for t in r.trials) <= 10


def test_probing_does_not_train_the_model_or_move_rng():
    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()

    def step(bs):
        loss = model(torch.randn(bs, 3, 16, 16)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()

    torchmagic.autobatch(step, budget=16 * MiB, device=CpuDevice())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit-identical weights
    assert opt.state_dict()["state"] == {}  # the momentum buffers the probes created are gone
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def test_fake_cuda_linear_law_and_memory_back_to_baseline():
    device = FakeCudaDevice(capacity_bytes=8 * 2**30)
    device.allocate(1 * 2**30)  # the model's weights, in use before the search

    def step(bs):
        need = 200 * MiB + 5 * MiB * bs
        device.allocate(need)
        device.free(need)

    r = torchmagic.autobatch(step, budget=0.9, device=device, restore=[])
    # budget: 90% of 8 GiB less the 1 GiB in use; limit: 10% margin below that
    assert r.budget_bytes == int(0.9 * 8 * 2**30) - 2**30
    expected = int((r.limit_bytes - 200 * MiB) // (5 * MiB))
    assert r.batch_size == expected
    # the warm-up at the smallest size, a second size for the line, its prediction, the next size (over
    # the limit), and on a GPU the answer run again after the search
    assert [t.batch_size for t in r.trials if not t.estimated] == [1, 2, expected, expected + 1, expected]
    assert device.memory_allocated() == 1 * 2**30 == r.memory_after_bytes == r.memory_before_bytes


def test_fake_cuda_oom_at_smallest_size():
    device = FakeCudaDevice(capacity_bytes=100 * MiB)

    def step(bs):
        device.allocate(10 * 2**30)

    r = torchmagic.autobatch(step, device=device, restore=[])
    assert r.batch_size is None and "out of memory" in r.reason
    assert "No batch size fits" in r.to_text()


class FakeActivation:
    """Device memory that lives as long as the Python object, like a tensor's storage."""

    def __init__(self, device, nbytes):
        device.allocate(nbytes)
        self.device, self.nbytes = device, nbytes

    def __del__(self):
        self.device.free(self.nbytes)


@pytest.mark.slow
def test_twenty_searches_leave_memory_at_baseline():
    device = FakeCudaDevice(capacity_bytes=4 * 2**30)

    def step(bs):
        held = [FakeActivation(device, 40 * MiB) for _ in range(bs)]  # noqa: F841
        # past capacity allocate() raises; the traceback's frames still hold `held`

    sizes = []
    for _ in range(20):
        sizes.append(torchmagic.autobatch(step, device=device, restore=[]).batch_size)
    assert device.memory_allocated() == 0
    assert len(set(sizes)) == 1 and sizes[0] == int(0.9 * 0.9 * 4 * 2**30 // (40 * MiB))


def test_non_oom_errors_propagate_and_state_is_restored():
    model = nn.Linear(4, 4)
    before = model.weight.detach().clone()

    def step(bs):
        with torch.no_grad():
            model.weight.add_(1.0)
        if bs > 2:
            raise ValueError("user bug")

    with pytest.raises(ValueError, match="user bug"):
        torchmagic.autobatch(step, budget=16 * MiB, device=CpuDevice())
    assert torch.equal(model.weight, before)


def test_target_batch_gives_accumulation_steps():
    device = FakeCudaDevice(capacity_bytes=2**30)

    def step(bs):
        device.allocate(MiB * bs)
        device.free(MiB * bs)

    r = torchmagic.autobatch(step, device=device, restore=[], target_batch=1000, max=100)
    assert r.batch_size == 100 and r.accumulation_steps == 10 and r.micro_batch == 100
    assert "Batch 1000: 10 accumulation steps of 100" in r.to_text()
    r = torchmagic.autobatch(step, device=device, restore=[], target_batch=1000, max=300)
    assert (r.batch_size, r.accumulation_steps, r.micro_batch) == (300, 4, 250)


def test_result_renders_and_serialises():
    import json

    device = FakeCudaDevice(capacity_bytes=2**30)
    r = torchmagic.autobatch(lambda bs: (device.allocate(MiB * bs), device.free(MiB * bs)),
                             device=device, restore=[])
    json.dumps(r.to_dict())
    assert r.to_text().startswith("Largest batch size that fits:")
    assert "<table" in r.to_html()


@pytest.mark.parametrize("kw, message", [({"budget": -1}, "budget"), ({"margin": 1.5}, "margin"),
                                         ({"min": 10, "max": 5}, "below min"),
                                         ({"target_batch": 0}, "target_batch")])
def test_bad_options(kw, message):
    with pytest.raises(ValueError, match=message):
        torchmagic.autobatch(lambda bs: None, **kw)


def test_cpu_budget_defaults_to_half_the_available_ram():
    budget, how = resolve_budget(None, CpuDevice())
    free, _ = CpuDevice().memory_capacity()
    assert budget == pytest.approx(free * 0.5, rel=0.05) and "of RAM available" in how
    assert AutobatchOptions().margin == 0.1


def test_throughput_ladder_and_knee():
    model = small_cnn()

    def step(bs):
        with torch.no_grad():
            model(torch.randn(bs, 3, 16, 16))

    r = torchmagic.autobatch(step, budget=8 * MiB, multiple_of=4, throughput=True, device=CpuDevice())
    sizes = [p.batch_size for p in r.throughput]
    assert sizes[-1] == r.batch_size and all(s <= r.batch_size for s in sizes)
    assert all(p.samples_per_s > 0 for p in r.throughput)
    best = max(p.samples_per_s for p in r.throughput)
    knee = next(p for p in r.throughput if p.batch_size == r.knee_batch_size)
    assert knee.samples_per_s >= 0.95 * best
    assert all(p.samples_per_s < 0.95 * best for p in r.throughput if p.batch_size < r.knee_batch_size)
    assert "the knee" in r.to_text() and r.to_dict()["knee_batch_size"] == r.knee_batch_size


def test_tabs_and_plot():
    device = FakeCudaDevice(capacity_bytes=2**30)
    r = torchmagic.autobatch(lambda bs: (device.allocate(MiB * bs), device.free(MiB * bs)),
                             device=device, restore=[])
    pages = tabs(r.to_html())
    assert [title for title, _ in pages] == ["Answer", "Memory law", "Trials"]
    assert 'src="data:image/png;base64,iVBORw0KGgo' in pages[1][1]  # a PNG, inlined


def _train_step(optimizer_cls):
    model = small_cnn()
    opt = optimizer_cls(model.parameters(), lr=1e-3)

    def step(bs):
        loss = nn.functional.cross_entropy(model(torch.randn(bs, 3, 16, 16)), torch.zeros(bs, dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step, model, opt


def test_fake_tensor_estimates_calibrated_and_harmless():
    step, model, opt = _train_step(torch.optim.SGD)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = torchmagic.autobatch(step, budget=32 * MiB, multiple_of=8, device=CpuDevice())
    estimates = [t for t in r.trials if t.estimated]
    sizes = [t.batch_size for t in estimates]
    assert sizes[:3] == [8, 64, 512] and len(sizes) <= MAX_ESTIMATES  # 8x apart to bracket, then narrowed
    # narrowed to a step: under the prediction the answer came from, the largest estimate predicted to
    # fit and the smallest predicted over are neighbours (either may be the halfway run's estimate)
    p = r.prediction
    under = [t.batch_size for t in estimates if p.peak(t.peak_bytes) <= r.limit_bytes]
    over = [t.batch_size for t in estimates if p.peak(t.peak_bytes) > r.limit_bytes]
    assert 0 < min(over) - max(under) <= max(8, 0.01 * max(under))
    real = [t for t in r.trials if not t.estimated and t.ran]
    # CPU: the limit is for the process's resident memory, which holds torch's allocations and more
    assert all(t.allocated_bytes <= t.peak_bytes for t in real) and "torch's share" in r.to_text()
    assert r.calibration is not None and 1.0 <= r.calibration < 2.0  # fake tensors see less
    assert r.answer_trial is not None and not r.answer_trial.estimated  # the answer still ran
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    text = r.to_text()
    assert "fake-tensor estimates" in text
    # what the prediction rested on (scaled by a run halfway, where resident memory grows with the
    # allocations) and how far the run it chose read from it
    assert p.batch_size is not None and p.read_at > 8 and p.share > 0 and p.measured_bytes is not None
    assert f"Predicted: batch {p.batch_size} at" in text and f"read in a real run at batch {p.read_at}" in text


def test_steps_that_cannot_run_on_fake_tensors_fall_back_to_real_runs():
    train, _, _ = _train_step(torch.optim.SGD)
    losses = []

    def step(bs):  # logs a value: .item() needs real data
        train(bs)
        losses.append(torch.ones(bs).sum().item())
    r = torchmagic.autobatch(step, budget=32 * MiB, multiple_of=8, device=CpuDevice())
    assert r.calibration is None and not any(t.estimated for t in r.trials)
    assert r.batch_size is not None


def test_adam_is_estimated_from_the_users_state_where_its_first_step_makes_its_moments():
    # Adam with state reads its step count with .item(), which fake tensors cannot; every estimate
    # starts from the user's state (no moments yet), as every trial does
    step, _, opt = _train_step(torch.optim.Adam)
    r = torchmagic.autobatch(step, budget=32 * MiB, multiple_of=8, device=CpuDevice())
    assert r.calibration is not None and any(t.estimated for t in r.trials), r.to_text()
    assert r.batch_size is not None and not opt.state


@pytest.mark.slow
def test_the_answer_fits_when_training_starts_from_the_users_state():
    """A trial is the user's first steps at its size: the optimizer's moments the first step creates
    count (found on an H200, where one step from a warm state chose a size that ran out of memory)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))  # 8 MiB of weights
    opt = torch.optim.Adam(model.parameters())  # 16 MiB of moments, made by the first step

    def step(bs):
        opt.zero_grad()
        model(torch.randn(bs, 1024)).square().mean().backward()
        opt.step()
    # 24 MiB of gradients and moments, ~32 MiB at the step's peak: a 96 MiB budget leaves batch 1 room for the
    # resident reads' spread (one run at 64 MiB failed batch 1 on a CI machine, 32-40 MiB reads here)
    r = torchmagic.autobatch(step, budget=96 * MiB, margin=0.0, estimate=False, device=CpuDevice())
    assert r.batch_size and not opt.state, r.to_text()
    with allocation_peak(torch.autograd.DeviceType.CPU) as reading:
        step(r.batch_size)
        step(r.batch_size)
    answer = next(t for t in r.trials if t.batch_size == r.batch_size and not t.estimated)
    # what training takes at the answer is what its trial counted (torch's share; the process's
    # resident growth, the rest of the peak, varies more), and it is under the limit
    assert reading.peak_bytes <= answer.allocated_bytes * 1.02 and reading.peak_bytes <= r.limit_bytes, \
        (reading.peak_bytes / MiB, r.to_text())


def test_no_estimate_option():
    step, _, _ = _train_step(torch.optim.SGD)
    r = torchmagic.autobatch(step, budget=32 * MiB, estimate=False, device=CpuDevice())
    assert not any(t.estimated for t in r.trials)


def test_fragmentation_at_oom_suggests_expandable_segments():
    device = FakeCudaDevice(capacity_bytes=4 * 2**30)

    def step(bs):
        device.allocate(2**30)  # a temporary the caching allocator keeps reserved after the free
        device.free(2**30)
        device.allocate(100 * MiB * bs)
        device.free(100 * MiB * bs)

    r = torchmagic.autobatch(step, device=device, restore=[], estimate=False)
    oom = [t for t in r.trials if not t.ran and not t.estimated]
    assert oom and any("expandable_segments" in note for note in r.notes)
    assert "expandable_segments" in r.to_text()


def test_fragmentation_left_by_an_out_of_memory_trial_does_not_shrink_the_answer():
    """Each trial starts from an emptied cache: a 1 GiB temporary kept reserved when a trial ran out of
    memory (unusable for the next trial's larger tensors, on this fake, until empty_cache) costs nothing."""
    answers = []
    for fragments in (False, True):
        device = FakeCudaDevice(capacity_bytes=4 * 2**30)
        device.fragments_after_oom = fragments

        def step(bs):
            device.allocate(2**30)  # a temporary the caching allocator keeps reserved after the free
            device.free(2**30)
            device.allocate(100 * MiB * bs)
            device.free(100 * MiB * bs)

        r = torchmagic.autobatch(step, device=device, restore=[], estimate=False, budget=4 * 2**30, margin=0)
        assert any(not t.ran for t in r.trials) and r.answer_trial.ok, r.to_text()
        answers.append(r.batch_size)
    assert answers[0] == answers[1] == 40  # the temporary is freed first: 40 x 100 MiB fit the 4 GiB, 41 not


def test_on_a_gpu_the_answer_runs_again_after_the_search_and_is_searched_again_below_if_it_no_longer_fits():
    """What the trials leave behind (here 1 GiB, a workspace kept from the last trial on) can change what
    fits: the answer runs once more after every other trial, and where it no longer fits the search runs
    again below it, in that state."""
    def search(drift_at: int | None):
        device = FakeCudaDevice(capacity_bytes=4 * 2**30)
        probes = []

        def step(bs):
            if drift_at is not None and len(probes) == drift_at and not device.allocated:
                device.allocate(2**30)  # kept: a workspace the last trial made
            device.allocate(100 * MiB * bs)
            device.free(100 * MiB * bs)

        options = AutobatchOptions(budget=4 * 2**30, margin=0, estimate=False)
        return run_autobatch(step, options, device=device, on_probe=probes.append).result, len(probes)

    steady, trials = search(None)
    assert steady.batch_size == 40 and steady.trials[-1].batch_size == 40 and steady.answer_trial.ok  # ran again
    assert sum(t.batch_size == 40 for t in steady.trials) == 2 and "Run again" not in steady.to_text()
    drifted, _ = search(trials - 1)  # the workspace appears as the answer runs again
    assert drifted.batch_size == 30, drifted.to_text()  # 30 x 100 MiB beside the 1 GiB kept
    assert drifted.answer_trial.ok and any(t.batch_size == 40 and not t.ran for t in drifted.trials)
    text = drifted.to_text()
    assert "Run again after the search" in text and "batch 40 ran out of memory" in text, text


def test_compiled_module_is_noted():
    model = torch.compile(nn.Linear(4, 4))
    device = FakeCudaDevice(capacity_bytes=2**30)
    r = torchmagic.autobatch(lambda bs: (device.allocate(MiB * bs), device.free(MiB * bs)),
                             device=device, restore=[model], estimate=False, max=64)
    assert any("torch.compile" in note for note in r.notes)


def _live_tensors() -> int:
    gc.collect()
    return sum(issubclass(type(o), torch.Tensor) for o in gc.get_objects())  # type(): no module __getattr__


@pytest.mark.slow
def test_cpu_searches_leave_no_tensor_and_resident_memory_near_baseline():
    """No search keeps a tensor; resident memory settles (glibc's heap and torch's caches grow, then
    stop: +10, +14, +17, +19, +21, +22 MiB after 10 to 60 searches on a 2-core Xeon; 15-29 MiB over 15
    searches after 5 in repeated runs, of which 2.4 MiB Python's, FakeTensorMode's dispatch cache), so
    resident growth over 6 searches after 3 is held against what a leak would take: a trial's tensors
    at a 16 MiB budget, each search, would be well over 60 MiB; the bound, 36 MiB, is 6 MiB a search.
    (10 searches took 62-74 s of a loaded two-worker CI.)"""
    step, _, _ = _train_step(torch.optim.SGD)
    device = CpuDevice()
    for _ in range(3):
        torchmagic.autobatch(step, budget=16 * MiB, device=device)
    device.empty_cache()
    before, tensors = device.memory_in_use(), _live_tensors()
    for _ in range(6):
        torchmagic.autobatch(step, budget=16 * MiB, device=device)
    assert _live_tensors() == tensors
    device.empty_cache()
    assert device.memory_in_use() - before < 36 * MiB


def test_throughput_fills_the_trials_samples_per_s():
    step, _, _ = _train_step(torch.optim.SGD)
    r = torchmagic.autobatch(step, budget=8 * MiB, multiple_of=8, throughput=True, device=CpuDevice())
    answer = r.answer_trial
    assert answer.samples_per_s == next(p.samples_per_s for p in r.throughput if p.batch_size == r.batch_size)
    assert all(t.samples_per_s is None for t in r.trials if t.estimated)
    assert r.plot_png()[:4] == b"\x89PNG"


# torch 2.8+ raises the driver's own errors as AcceleratorError (a RuntimeError); earlier torch as RuntimeError
AcceleratorError = getattr(torch, "AcceleratorError", RuntimeError)

@pytest.mark.parametrize("message, error", [
    ("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`", RuntimeError),
    ("CUDA error: out of memory", AcceleratorError),  # the driver's own
])
def test_disguised_oom_is_bisected_like_torchs_own(message, error):
    from ..fakes import DisguisedOomCudaDevice

    device = DisguisedOomCudaDevice(message, capacity_bytes=2 * 2**30, error=error)

    def step(bs):
        need = 100 * MiB + 7 * MiB * bs
        device.allocate(need)
        device.free(need)

    # a budget past the device's 2 GiB: the search runs into the device's own limit
    r = torchmagic.autobatch(step, budget=4 * 2**30, margin=0, device=device, restore=[])
    assert device.ooms > 0 and any(not t.ran and not t.estimated and t.error.startswith(error.__name__)
                                   for t in r.trials)
    assert r.batch_size == (2048 - 100) // 7  # the largest that fits, found through the failures


def test_accumulation_sums_to_the_target_exactly_where_a_few_more_steps_allow():
    from torchmagic.features.autobatch.build import accumulation_steps as _accumulation

    assert _accumulation(256, 49, 1) == (8, 32)      # not 6 steps of 43 (258)
    assert _accumulation(1000, 300, 1) == (4, 250)
    assert _accumulation(96, 40, 8) == (3, 32)       # equal, and multiples of 8
    assert _accumulation(97, 40, 1) == (3, 33)       # a prime: the fewest steps, 99 in effect
    assert _accumulation(None, 40, 1) == (None, None) and _accumulation(256, None, 1) == (None, None)


def test_a_resident_footprint_that_differs_between_runs_is_read_again_and_its_most_counts():
    """On CPU a trial's resident growth can differ from run to run of the same steps (glibc's heap):
    the trial reads it in more runs, counts the most against the limit and says so."""
    runs = itertools.count()
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(bs):
        # runs of TRIAL_STEPS steps take 0, 24 or 48 MiB more in turn, as bytes Python writes (resident)
        held = b"\x01" * ((next(runs) // TRIAL_STEPS % 3) * 24 * MiB)
        opt.zero_grad()
        model(torch.randn(bs, 64)).square().mean().backward()
        opt.step()
        del held

    r = torchmagic.autobatch(step, budget=1024 * MiB, max=4, estimate=False, device=CpuDevice())
    real = [t for t in r.trials if not t.estimated]
    assert r.batch_size == 4 and real
    for trial in real:
        reads = trial.footprint_reads
        assert reads is not None and len(reads) == FOOTPRINT_RUNS[1], r.to_text()
        assert max(reads) >= 48 * MiB and max(reads) - min(reads) >= 40 * MiB, reads
        # it counts what one more run could take: an upper 95% prediction bound, from the line through
        # its and its neighbours' reads against torch's allocations (the first trial, with none, of its own)
        assert trial.peak_bytes > max(reads), (trial.peak_bytes, reads)
    assert real[0].peak_bytes == round(upper_prediction_bound(list(real[0].footprint_reads)))
    text = r.to_text()
    assert "Resident memory differed from run to run" in text and "MALLOC_MMAP_THRESHOLD_" in text
    assert "prediction bound" in text and "resident reads" in text and f"({FOOTPRINT_RUNS[1]} runs)" in text


def test_a_footprint_that_repeats_is_read_twice():
    model = nn.Linear(64, 64)
    calls = []

    def step(bs):
        calls.append(bs)
        model(torch.randn(bs, 64)).sum().backward()

    r = torchmagic.autobatch(step, budget=1024 * MiB, max=2, estimate=False, device=CpuDevice())
    # the trial at 2: its profiled run, then two runs that read the footprint alike
    assert [t.batch_size for t in r.trials] == [1, 2] and calls.count(2) == 3 * TRIAL_STEPS
    assert [t.footprint_reads for t in r.trials] == [None] * len(r.trials), r.to_text()  # kept only where they differ
    assert "differed from run to run" not in r.to_text() and "resident reads" not in r.to_text()
