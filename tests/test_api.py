"""The Python API twin: same engine, same result objects, no IPython needed."""

import json
import subprocess
import sys

import pytest
import torch

import torchmagic
from torchmagic.features.profile.result import ProfileResult


def test_profile_function():
    x = torch.randn(64, 64)
    r = torchmagic.profile(lambda: x @ x, steps=2, warmup=1)
    assert isinstance(r, ProfileResult) and r.steps == 2
    assert any(op.name == "aten::mm" and op.calls == 2 for op in r.ops)
    json.dumps(r.to_dict())


def test_profile_code_keeps_assignments_in_namespace():
    ns = {"torch": torch}
    r = torchmagic.profile_code("y = torch.arange(4.0)\nz = y.sum()", ns, steps=1)
    assert ns["z"].item() == 6.0 and r.label == "code"


def test_profile_reraises_with_partial_result_attached():
    def step():
        torch.ones(3).add(1)
        raise RuntimeError("user bug")

    with pytest.raises(RuntimeError, match="user bug") as info:
        torchmagic.profile(step)
    partial = info.value.torchmagic_result
    assert partial.error == "RuntimeError: user bug"
    assert any(op.name == "aten::add" for op in partial.ops)
    assert not torch.autograd.profiler._is_profiler_enabled


def test_bad_options_raise_value_error():
    with pytest.raises(ValueError, match="steps must be at least 1"):
        torchmagic.profile(lambda: None, steps=0)


def test_profile_time_categories_cover_the_step():
    x = torch.randn(128, 128)
    r = torchmagic.profile(lambda: [x @ x for _ in range(10)], steps=3, warmup=1)
    profiled = sum(r.categories_s.values())
    # self times of everything inside the step markers add up to the marked step time
    assert profiled == pytest.approx(sum(r.step_s), rel=0.25)


def test_import_is_light():
    code = ("import sys, torchmagic; heavy = [m for m in ('torch', 'IPython', 'matplotlib', 'jupyterlab', "
            "'ipywidgets') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_rendering_does_not_import_matplotlib_until_drawn():
    """A profile's report (its timeline an SVG drawing) needs no matplotlib: only an optional plot imports it."""
    code = ("import sys, torchmagic, torch\n"
            "r = torchmagic.profile(lambda: torch.ones(2) + 1)\n"
            "r.to_text(); print('matplotlib' in sys.modules)\n"
            "assert 'data:image/svg+xml' in r.to_html(); print('matplotlib' in sys.modules)\n"
            "from torchmagic.core.render import plot; plot.new_figure(1, 1); print('matplotlib' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True"]


def test_profiler_banner_is_not_printed_but_other_stderr_is(capfd):
    import sys

    def step():
        torch.ones(2).add(1)
        print("user stderr line", file=sys.stderr)

    torchmagic.profile(step)
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "profiler_stop" not in err
    assert "user stderr line" in err


def test_free_of_a_block_from_before_the_profile_is_not_warned_about(capfd):
    holder = [torch.randn(1000)]
    torchmagic.profile(lambda: holder.clear(), memory=True)
    assert "Memory block of unknown size" not in capfd.readouterr().err
