"""The trace summary over real profiles: self times, steps, categories, timeline bounds."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from torchmagic.features.profile import categories, frames, timeline
from torchmagic.features.profile.live_table import summarize_live


def summarize(fn, steps=2, **kw):
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, **kw) as prof:
        for i in range(steps):
            with record_function(f"ProfilerStep#{i}"):
                fn()
    results = prof.profiler.kineto_results
    return summarize_live(results, shapes=True)[0]


def test_self_times_add_up_to_step_time():
    x = torch.randn(64, 64)
    s = summarize(lambda: [x.relu() @ x for _ in range(20)])
    assert s.steps == 2
    assert sum(s.category_us.values()) == pytest.approx(s.total_step_us, rel=1e-6)
    assert all(op.self_cpu_us <= op.total_cpu_us + 1e-6 for op in s.ops.values())


def test_events_outside_steps_are_ignored():
    x = torch.randn(8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        x.sin()  # before any step
        with record_function("ProfilerStep#0"):
            x.cos()
    results = prof.profiler.kineto_results
    s = summarize_live(results)[0]
    assert "aten::cos" in s.ops and "aten::sin" not in s.ops


def test_phases_from_real_training_step():
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 16)), batch_size=8)

    def step():
        for (x,) in data:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

    s = summarize(step)
    for category in (categories.DATA, categories.FORWARD, categories.BACKWARD, categories.OPTIMIZER):
        assert s.category_us[category] > 0, category
    assert s.optimizer_names == {"SGD"}
    assert s.backward_events > 0


def test_copy_inside_another_op_is_not_a_user_copy():
    w_, b_ = torch.randn(64, 64), torch.randn(64)
    s = summarize(lambda: torch.addmm(b_, w_, w_))  # addmm copies the bias internally
    assert s.copy_us == 0.0
    s = summarize(lambda: w_.t().contiguous())
    assert s.copy_us > 0 and s.layout_copies == 2


def test_shapes_are_recorded_per_op():
    x = torch.randn(3, 5)
    s = summarize(lambda: x @ x.t())
    assert "[3, 5], [5, 3]" in s.ops["aten::mm"].top_shapes()


def test_timeline_is_bounded_and_keeps_every_step(monkeypatch):
    monkeypatch.setattr(timeline, "MAX_BARS_PER_LANE", 50)
    x = torch.randn(4)
    s = summarize(lambda: [x + 1 for _ in range(500)], steps=3)
    assert len(s.timeline) <= 50
    last_step_start = s.step_start_us[-1]
    assert any(span.start_us + span.dur_us > last_step_start for span in s.timeline)
    covered = sum(span.dur_us for span in s.timeline)
    assert covered <= s.total_step_us * 1.01


def test_a_package_whose_path_holds_path_objects_is_read_as_installed(monkeypatch, tmp_path):
    # transformers 5 puts PosixPath objects in its __path__: --stack and --memory crashed on them
    import importlib.machinery
    import pathlib
    import sys
    import types

    site = tmp_path / "site-packages" / "pathpkg"
    spec = importlib.machinery.ModuleSpec("pathpkg", None, is_package=True)
    spec.submodule_search_locations = [pathlib.Path(site)]
    module = types.ModuleType("pathpkg")
    module.__spec__ = spec
    monkeypatch.setitem(sys.modules, "pathpkg", module)
    frames.installed_package.cache_clear()
    frames.is_user_frame.cache_clear()
    try:
        assert frames.installed_package("pathpkg")
        assert not frames.is_user_frame("pathpkg/models/gpt2.py(120): forward")
        local = types.ModuleType("localpkg")
        local.__spec__ = importlib.machinery.ModuleSpec("localpkg", None, is_package=True)
        local.__spec__.submodule_search_locations = [pathlib.Path(tmp_path / "localpkg")]
        monkeypatch.setitem(sys.modules, "localpkg", local)
        assert not frames.installed_package("localpkg") and frames.is_user_frame("localpkg/train.py(3): run")
    finally:
        frames.installed_package.cache_clear()
        frames.is_user_frame.cache_clear()


def test_a_ranges_name_is_read_as_the_user_wrote_it():
    """Read from kineto's events, not its Chrome-trace writer, which writes these names as "unknown", drops the
    newline, makes the backslash a slash and leaves the quote unescaped (the file is then no JSON)."""
    names = ['say "hi"', "back\\slash", "two\nlines", "ünïcödé", "\x1b[31mred", "tab\there"]
    x = torch.randn(8, 8)

    def step():
        for name in names:
            with record_function(name):
                x @ x
    s = summarize(step)
    assert set(names) <= set(s.ops) and all(s.ops[name].calls == 2 for name in names)
