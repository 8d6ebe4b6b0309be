"""The user's files and settings: %%torchprofile --trace writes a regular file, whole, and only
where nothing was (or with --trace-overwrite); --diff against a profile whose steps cannot be
compared, and %autobatch --budget with a unit, are one line before anything runs."""

import json
import os

import pytest

from torchmagic.core.devices import DeviceInfo
from torchmagic.features.profile.result import ProfileResult

from ..conftest import run

CELL = "ran = True\ntorch.randn(16, 16).relu()"


def _refused(shell, line: str) -> str:
    shell.user_ns["ran"] = False
    _, captured = run(shell, f"%%torchprofile {line}\n{CELL}")
    shown = (captured.stdout + captured.stderr).strip()
    assert "\n" not in shown and shown.startswith("UsageError: %%torchprofile: "), shown
    assert shell.user_ns["ran"] is False  # refused before the cell ran
    return shown


def _leftovers(folder) -> list[str]:
    return [name for name in os.listdir(folder) if ".partial" in name]


def test_an_existing_file_is_replaced_only_when_asked(shell, tmp_path):
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"weights")
    shown = _refused(shell, f"--trace {checkpoint}")
    assert shown.endswith(f"--trace-overwrite is needed to replace '{checkpoint}', which exists (or choose a new name)")
    assert checkpoint.read_bytes() == b"weights"
    result, captured = run(shell, f"%%torchprofile --trace {checkpoint} --trace-overwrite -o r\n{CELL}")
    assert result.success and "Chrome trace written to" in captured.outputs[0].data["text/plain"]
    assert "aten::relu" in {e.get("name") for e in json.loads(checkpoint.read_text())["traceEvents"]}
    assert _leftovers(tmp_path) == []
    assert _refused(shell, "--trace-overwrite").endswith("--trace-overwrite goes with --trace PATH")


def test_the_python_twin_refuses_and_replaces_the_same_way(tmp_path):
    import torch

    import torchmagic
    from torchmagic.core.limits import SettingError

    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"weights")
    step = lambda: torch.relu(torch.randn(8, 8))  # noqa: E731
    with pytest.raises(SettingError, match="trace_overwrite is needed to replace"):
        torchmagic.profile(step, trace=str(checkpoint))
    assert checkpoint.read_bytes() == b"weights"
    torchmagic.profile(step, trace=str(checkpoint), trace_overwrite=True)
    assert "aten::relu" in {e.get("name") for e in json.loads(checkpoint.read_text())["traceEvents"]}
    assert _leftovers(tmp_path) == []


def test_only_regular_files_are_written(shell, tmp_path):
    target = tmp_path / "kept.json"
    target.write_text("mine")
    (tmp_path / "link.json").symlink_to(target)
    os.mkfifo(tmp_path / "pipe.json")
    (tmp_path / "folder").mkdir()
    for path, problem in [(tmp_path / "link.json", "is a symbolic link"), (tmp_path / "pipe.json", "is a named pipe"),
                          (tmp_path / "folder", "is a directory"), ("/dev/null", "is a device"),
                          ("/proc/self/trace.json", "is the kernel's, not storage"),
                          (tmp_path / "no" / "t.json", "does not exist")]:
        for overwrite in ("", " --trace-overwrite"):
            assert problem in _refused(shell, f"--trace {path}{overwrite}")
    assert (tmp_path / "link.json").is_symlink() and target.read_text() == "mine"
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_the_trace_is_claimed_only_when_written_whole(shell, tmp_path, monkeypatch):
    import torch

    folder = tmp_path / "gone"
    folder.mkdir()
    result, captured = run(shell, f"%%torchprofile -o r --trace {folder / 't.json'}\n"
                                  f"import shutil\nshutil.rmtree({str(folder)!r})")
    shown = captured.outputs[0].data["text/plain"]
    assert result.success and "Chrome trace written" not in shown and shell.user_ns["r"].trace_path is None
    assert f"Could not write the trace to {folder / 't.json'}: FileNotFoundError" in shown

    old = tmp_path / "old.json"
    old.write_text("yesterday's trace")

    def half_then_full_disk(self, path, *args, **kwargs):
        with open(path, "w") as f:
            f.write('{"traceEvents": [')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", half_then_full_disk)
    result, captured = run(shell, f"%%torchprofile -o r --trace {old} --trace-overwrite\n{CELL}")
    shown = captured.outputs[0].data["text/plain"]
    assert result.success and "Chrome trace written" not in shown and "No space left on device" in shown
    assert old.read_text() == "yesterday's trace" and _leftovers(tmp_path) == []


@pytest.mark.parametrize("steps", [[0.0], [-1e-6, 0.002], [float("nan")]])
def test_diff_against_steps_without_a_positive_time_is_one_line(shell, steps):
    shell.user_ns["loaded"] = ProfileResult(label="trace", device=DeviceInfo("cpu", "cpu", "cpu"), step_s=steps)
    assert "--diff loaded: its steps must each take a positive time" in _refused(shell, "--diff loaded")


@pytest.mark.parametrize("budget, message", [
    ("1B", "--budget 1B is 1 byte(s): too small to run any step"),
    ("512kib", "--budget 512kib is 524,288 byte(s): too small"),
    ("2", "--budget 2 is 2 byte(s): too small"),
])
def test_a_budget_with_a_unit_is_a_size_and_a_tiny_one_is_refused(shell, budget, message):
    from torchmagic.features.autobatch.magic import parse_budget

    shell.run_cell("calls = []\ndef step(n):\n    calls.append(n)")
    _, captured = run(shell, f"%autobatch --budget {budget} step")
    shown = (captured.stdout + captured.stderr).strip()
    assert shown == f"UsageError: %autobatch: {message}" + shown.split(message, 1)[1] and "\n" not in shown
    assert shell.user_ns["calls"] == []
    assert parse_budget("1") == 1 and parse_budget("1MiB") == 2**20 and parse_budget("1GB") == 1e9
