"""Control characters in every name the user's code gives, in every view of every magic (issue 51).

A module's, class's, variable's or record_function's name, a dataset's error message: each may hold an
ANSI escape (colour, clear the screen, move the cursor), a carriage return (overwrite the line), a bell or a
bidirectional override (reorder what is read).  Whatever a magic shows (the displayed text and HTML, what it
prints, the result's to_text(), to_html() and repr) writes them out as escapes, never raw."""

from __future__ import annotations

import re

import pytest

from .conftest import run

EVIL = "\x1b[31mred\x1b[2J\rcr\x07bell\u202eevil\x9b"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

SETUP = """
import torch
from torch import nn
Evil = type(EVIL, (nn.Module,), {"forward": lambda self, x: torch.relu(x)})
net = nn.Sequential()
net.add_module(EVIL, nn.Linear(16, 16))
net.add_module("act", Evil())
x = torch.randn(8, 16)
globals()[EVIL] = torch.ones(256, 1024)

class EvilItems(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            raise ValueError(EVIL)
        return torch.ones(16)
EvilItems.__name__ = EvilItems.__qualname__ = EVIL
items = EvilItems()

def pad(batch):
    return torch.stack(batch)
pad.__name__ = pad.__qualname__ = EVIL

def step(bs):
    with torch.profiler.record_function(EVIL):
        net(torch.randn(bs, 16)).sum().backward()
step.__name__ = step.__qualname__ = EVIL
"""

PROFILED = """
with torch.profiler.record_function(EVIL):
    y = net(x)
    y.sum().backward()
"""

# each magic and form, run on the names above
RUNS = {
    "torchprofile": ("%%torchprofile --steps 2 --record-shapes --memory -o r", PROFILED),
    "torchprofile --diff": ("%%torchprofile --steps 2 --diff before -o r", PROFILED),
    "torchprofile --load": ("%torchprofile --load {trace} -o r", None),
    "gpumem": ("%gpumem -o r", None),
    "gpumem cell": ("%%gpumem -o r", "globals()[EVIL + 'cell'] = torch.ones(128, 1024)\n"),
    "loadertune": ("%loadertune items batch_size=8 collate_fn=pad --workers 0,1 --batches 3 --rounds 2 -o r", None),
    "amp_compare": ("%%amp_compare --model net --variants eager,inference_mode --runs 6 --min-time 0.01 --warmup 1 -o r",
                    "net(x)\n"),
    "autobatch": ("%autobatch step --budget 64MiB --max 64 --no-estimate -o r", None),
}

# where a report shows one of the names (written out); kineto itself writes a range whose name holds a control
# character to its trace file as "unknown", and the comparison and the batch search name the cell's variants
# and sizes, not its modules
NAME_SHOWN = {"torchprofile", "torchprofile --diff", "gpumem", "gpumem cell", "loadertune"}


def _raw_in(label: str, text: str) -> list[str]:
    return [f"{label}: {text[max(0, m.start() - 30): m.end() + 10]!r}" for m in RAW.finditer(text or "")]


@pytest.mark.parametrize("magic", RUNS)
def test_no_control_character_from_a_name_reaches_any_view(shell, tmp_path, magic):
    shell.user_ns["EVIL"] = EVIL
    shell.run_cell(SETUP)
    line, cell = RUNS[magic]
    if magic == "torchprofile --diff":
        run(shell, "%%torchprofile --steps 2 -o before -q\n" + PROFILED)
    if magic == "torchprofile --load":
        trace = tmp_path / "evil.json"
        run(shell, f"%%torchprofile --steps 2 --trace {trace} -q\n" + PROFILED)
        line = line.format(trace=trace)
    result, captured = run(shell, line if cell is None else f"{line}\n{cell}")
    assert result.error_in_exec is None, captured.stdout + captured.stderr
    r = shell.user_ns["r"]
    shown = {"stdout": captured.stdout, "stderr": captured.stderr, "to_text": r.to_text(), "to_html": r.to_html(),
             "repr": repr(r), "str": str(r)}
    for i, output in enumerate(captured.outputs):
        for mime, data in output.data.items():
            if isinstance(data, str):
                shown[f"output {i} {mime}"] = data
    raw = [found for label, text in shown.items() for found in _raw_in(label, text)]
    assert raw == [], "\n".join(raw)
    if magic in NAME_SHOWN:
        assert "\\x1b[31mred" in r.to_text() and "\\x1b[31mred" in r.to_html(), "the name is shown, written out"
