"""--memory: torch's allocations over the profiled steps, and the largest alive at the peak, each with
the op that made it and the user's own frames (a notebook cell as In [n])."""

import torch

import torchmagic
from torchmagic.core.devices import CpuDevice

from ..conftest import run

MiB = 2**20


def _scratch(n):
    return torch.empty(n, 1024, 256)  # n MiB


def test_the_largest_allocation_at_the_peak_names_the_function_that_made_it():
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8))

    def train_step():
        buffer = _scratch(64)            # alive over the forward and backward: the peak's largest
        model(torch.randn(128, 256)).sum().backward()
        del buffer

    r = torchmagic.profile(train_step, memory=True, steps=2, warmup=1, device=CpuDevice())
    top = r.largest_allocations[0]
    assert top.bytes == 64 * MiB and top.op == "aten::empty" and top.device == "cpu"
    assert top.stack[0].startswith("_scratch  (") and top.stack[1].startswith("train_step  (")
    assert "test_memory_timeline.py" in top.stack[0]
    assert all(not frame.startswith(("torch/", "torchmagic")) for a in r.largest_allocations for frame in a.stack)
    points = r.memory_timeline["cpu"]
    assert points[0][1] == 0 and max(p[1] for p in points) >= 64 * MiB
    assert all(a <= b for (a, _, _), (b, _, _) in zip(points, points[1:]))  # in time order
    text = r.to_text()
    assert "The largest allocations alive at the peak:" in text and "64.0 MiB" in text
    assert "memory over the profiled steps" in r.to_html()


def test_in_a_notebook_the_stack_shows_the_cell(shell):
    shell.run_cell("import torch\ndef make(n):\n    return torch.ones(n, 1024, 256)\n", store_history=True)
    result, _ = run(shell, "%%torchprofile --memory -q -o r\nkept = make(32)\n", store_history=True)
    assert result.success
    top = shell.user_ns["r"].largest_allocations[0]
    assert top.bytes == 32 * MiB and top.stack[0].startswith("make  (In [") and "top level" in top.stack[1]
