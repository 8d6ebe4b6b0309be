"""Ctrl-C at every line of the code that gives things back: nothing is left behind.

A SIGINT is handled by Python at some instruction of whatever runs; here the handler in place is
called, as Python would call it, at each line of each release function in turn (a trace function
does it, so each line is hit exactly), while a real magic's engine runs.  After each, the profiler
is off, fd 2 is where it was, gc is on, grad mode is on, the weights and settings are back and the
SIGINT handler is Python's own again.
"""

import gc
import os
import signal
import sys
import weakref

import pytest
import torch
from torch import nn

import torchmagic
from torchmagic.core import interrupts
from torchmagic.core.devices import profiler
from torchmagic.core import gc_pause, settings, state
from torchmagic.features.loadertune import dataloader as loader_plumbing
from torchmagic.features.loadertune import run as loadertune


def _lines(code) -> list[int]:
    return sorted({line for _, _, line in code.co_lines() if line is not None and line > code.co_firstlineno})


def interrupt_at(code, line):
    """A trace function that delivers SIGINT, once, when ``code`` reaches ``line``."""
    fired = []

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line and not fired:
            fired.append(line)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is code else None

    return tracer, fired


def _each_line(code, run) -> tuple[int, int]:
    """Run ``run`` once per line of ``code`` with a SIGINT delivered there; (lines hit, interrupted)."""
    hit = interrupted = 0
    for line in _lines(code):
        tracer, fired = interrupt_at(code, line)
        sys.settrace(tracer)
        try:
            run()
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            sys.settrace(None)
        hit += bool(fired)
        _assert_clean(f"{code.co_qualname}, line {line}")
    return hit, interrupted


def _fd2():
    st = os.fstat(2)
    return st.st_dev, st.st_ino


FD2 = None
HOOK = None  # sys.unraisablehook as the test found it (pytest's own)


def _assert_clean(where):
    assert not torch.autograd._profiler_enabled(), f"{where}: the profiler is still on"
    assert _fd2() == FD2, f"{where}: fd 2 still redirected"
    assert gc.isenabled(), f"{where}: gc left off"
    assert gc.get_freeze_count() == 0, f"{where}: objects left set aside from the collector"
    assert torch.is_grad_enabled(), f"{where}: grad mode left off"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, f"{where}: SIGINT handler not put back"
    assert not interrupts.is_guarded(), f"{where}: still guarded"
    assert sys.unraisablehook is HOOK, f"{where}: the unraisable hook not put back"


@pytest.fixture(autouse=True)
def _clean_start():
    global FD2, HOOK
    FD2, HOOK = _fd2(), sys.unraisablehook
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _profile():
    x = torch.randn(32, 32)
    torchmagic.profile(lambda: (x @ x).sum(), steps=1, warmup=0)


def _autobatch():
    torchmagic.autobatch(lambda bs: torch.ones(bs, 256).sum(), budget=2**20, max=64, device="cpu")


def _measure_memory():
    torchmagic.measure_memory(lambda: torch.ones(1000).sum(), device="cpu")


RELEASES = {
    "stop_profiler": (profiler.stop_profiler, _profile),
    "banner exit": (profiler.without_profiler_banner.release, _profile),
    "banner enter": (profiler.without_profiler_banner.acquire, _profile),
    "peak scope exit": (profiler.allocation_peak.release, _measure_memory),
    "peak scope enter": (profiler.allocation_peak.acquire, _measure_memory),
    "held scope exit": (interrupts.HeldScope.__exit__, _profile),
    "held scope enter": (interrupts.HeldScope.__enter__, _profile),
    "guard exit": (interrupts.guarded.__exit__, _profile),
    "guard enter": (interrupts.guarded.__enter__, _profile),
    "gc pause exit": (gc_pause.gc_paused.release, _profile),
    "heap set aside exit": (gc_pause.heap_set_aside.release, _autobatch),
    "heap set aside enter": (gc_pause.heap_set_aside.acquire, _autobatch),
}


@pytest.mark.parametrize("name", RELEASES)
def test_a_ctrl_c_at_any_line_of_a_release_leaves_nothing_behind(name):
    function, run = RELEASES[name]
    hit, interrupted = _each_line(function.__code__, run)
    assert hit > 0, f"{name}: no line was reached"
    assert interrupted == hit, f"{name}: {hit - interrupted} of {hit} Ctrl-Cs swallowed (the run reported success)"


def test_a_ctrl_c_while_weights_and_settings_are_put_back_waits_until_all_is_back():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
    x = torch.randn(8, 16)
    weights = [p.detach().clone() for p in net.parameters()]
    before = settings.TorchSettings.capture()

    def step(m):
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()

    def run():
        torchmagic.compare(step, model=net, variants="eager,amp", runs=2, warmup=0, min_time=0.001)

    for code in (state.Snapshot.restore.__code__, settings.TorchSettings.restore.__code__):
        hit, interrupted = _each_line(code, run)
        assert hit > 0 and interrupted > 0
        assert all(torch.equal(p, w) for p, w in zip(net.parameters(), weights)), code.co_qualname
        assert not opt.state and settings.TorchSettings.capture() == before


@pytest.mark.slow
def test_loader_workers_are_stopped_whatever_line_a_ctrl_c_lands_on():
    data = torch.utils.data.TensorDataset(torch.randn(64, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=1, multiprocessing_context="fork")
    import multiprocessing

    def run():
        torchmagic.loadertune(loader, workers=[0, 1], rounds=2, batches=2, device="cpu")

    for code in (loader_plumbing.shut_down.__code__, loadertune._Tuner.give_back.__code__,
                 loadertune._Tuner._iter.__code__):
        _each_line(code, run)
        assert not [p for p in multiprocessing.active_children() if p.is_alive()], code.co_qualname


def test_the_users_code_stays_interruptible_and_the_handler_is_put_back():
    def step():
        signal.getsignal(signal.SIGINT)(signal.SIGINT, sys._getframe())  # Ctrl-C inside the user's step

    with pytest.raises(KeyboardInterrupt):
        torchmagic.compare(lambda: step(), variants="eager", runs=2, warmup=0)
    _assert_clean("compare")


def test_a_ctrl_c_that_lands_in_a_weakref_callback_is_not_lost():
    """Python drops an exception raised in a weakref callback ("Exception ignored in"); under a
    guard the Ctrl-C is kept and raised when the guard ends (or at the next release before it)."""
    class Cached:
        pass

    ran = []

    def callback(_):  # the SIGINT handler runs here, as Python would run it at a check in the callback
        signal.getsignal(signal.SIGINT)(signal.SIGINT, sys._getframe())

    hook = sys.unraisablehook
    with pytest.raises(KeyboardInterrupt):
        with interrupts.guarded():
            obj = Cached()
            ref = weakref.ref(obj, callback)  # noqa: F841
            del obj  # the callback runs, and its KeyboardInterrupt is unraisable
            ran.append(1)
    assert ran == [1] and sys.unraisablehook is hook
    _assert_clean("weakref callback")
    with interrupts.guarded():  # outside the guard's life, and with no Ctrl-C, nothing is sent
        pass


def test_an_interrupted_batch_search_hands_over_its_trials_and_no_answer():
    model = nn.Linear(64, 64)
    sizes = []

    def step(bs):
        # each trial at its own size (real runs only: 1, 2, 4, ...), in several runs of its steps
        if bs not in sizes:
            sizes.append(bs)
        if len(sizes) == 3:  # the user presses Ctrl-C in the third trial's first step
            raise KeyboardInterrupt
        model(torch.randn(bs, 64)).sum().backward()

    with pytest.raises(KeyboardInterrupt) as caught:
        torchmagic.autobatch(step, budget=2**26, max=4096, estimate=False, device="cpu")
    result = caught.value.torchmagic_result
    assert result.batch_size is None and len(result.trials) == 2
    assert result.reason.startswith("interrupted after 2 trials") and "larger may fit" in result.reason
    _assert_clean("autobatch")


def test_an_interrupted_loader_sweep_recommends_nothing_and_says_how_far_it_got():
    class Items(torch.utils.data.Dataset):
        served = 0

        def __len__(self):
            return 512

        def __getitem__(self, i):
            Items.served += 1
            if Items.served == 200:
                raise KeyboardInterrupt
            return torch.full((4,), float(i))

    loader = torch.utils.data.DataLoader(Items(), batch_size=8)
    with pytest.raises(KeyboardInterrupt) as caught:
        torchmagic.loadertune(loader, workers=[0, 1], rounds=2, seconds=0.2, device="cpu")
    result = caught.value.torchmagic_result
    assert result.best == result.current and result.speedup is None
    assert result.stopped.startswith("interrupted after") and "no change is recommended" in result.stopped
    _assert_clean("loadertune")
