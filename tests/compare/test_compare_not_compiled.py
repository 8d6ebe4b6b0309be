"""%%amp_compare's compile rows in a real IPython shell, on models dynamo only partly compiles or not at all.

Dynamo gives up on a whole function when a graph break falls inside one of its loops (a top-2 MoE's
per-expert dispatch: nonzero's output shape depends on the data) or when it meets what it cannot wrap
where it cannot break the graph (``self.lstm``: dynamo does not trace nn.LSTM), and it never tries that
function again.  ``torch.compile(model)`` then compiles only what the given-up function calls, or
nothing: a compile row must say which, and never time eager under the compile's name.

Each test defines its own classes: dynamo caches compiled code, and what it gave up on, per code object.
"""

import torch

from torchmagic.features.compare.compile_watch import compiled_calls

from ..conftest import run

MOE = """
import torch
from torch import nn
import torch.nn.functional as F

class Expert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.up, self.down = nn.Linear(d, h), nn.Linear(h, d)
    def forward(self, x):
        return self.down(F.silu(self.up(x)))

class MoE(nn.Module):
    '''Top-2 routing, then each expert on the tokens routed to it (Mixtral-style dispatch).'''
    def __init__(self, d=32, h=64, experts=4):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, h) for _ in range(experts))
    def forward(self, x):
        weights, chosen = torch.topk(F.softmax(self.router(x), dim=-1), 2, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(chosen == i, as_tuple=True)
            out.index_add_(0, rows, expert(x.index_select(0, rows)) * weights[rows, slot, None])
        return out

torch.manual_seed(0)
moe, tokens = MoE().eval(), torch.randn(64, 32)
"""

LSTM_IN_ENCODER = """
import torch
from torch import nn

class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
    def forward(self, x):
        return self.lstm(x)[0]

class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.encoder, self.head = nn.Linear(8, 16), Encoder(), nn.Linear(32, 4)
    def forward(self, x):
        return self.head(self.encoder(torch.tanh(self.embed(x)))[:, -1])

torch.manual_seed(0)
tagger, seq = Tagger().eval(), torch.randn(8, 12, 8)
"""

PLAIN_LSTM = """
import torch
from torch import nn

class Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 4)
    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])

torch.manual_seed(0)
lstm, seq = Lstm().eval(), torch.randn(8, 12, 16)
"""

QUICK = "--runs 6 --warmup 1 -o r"


def _compare(shell, setup: str, variants: str, cell: str):
    assert shell.run_cell(setup).success
    result, captured = run(shell, f"%%amp_compare --variants {variants} {QUICK}\n{cell}")
    assert result.success, result.error_in_exec
    return shell.user_ns["r"], captured


def _shown(captured) -> tuple[str, str]:
    data = captured.outputs[0].data
    return data["text/plain"], data["text/html"]


def _timed_as_compile(v) -> None:
    """Compiled graphs ran in its runs, and its speedup is a measurement of its own rounds."""
    assert v.ok and not v.fell_back and v.graphs >= 1 and v.graph_calls >= 1, (v.error, v.notes)
    assert v.median_s > 0 and len(v.samples_s) == 6 and v.ci is not None and v.ci[0] <= v.speedup <= v.ci[1]
    assert v.numerics_ok, (v.max_rel_err, v.notes)


def test_a_top2_moe_compiles_its_experts_and_says_its_forward_ran_eager(shell):
    r, captured = _compare(shell, MOE, "eager,compile", "with torch.no_grad():\n    y = moe(tokens)\ny")
    v = r["compile"]
    text, html = _shown(captured)
    notes = [line for line in text.splitlines() if line.startswith("compile: dynamo gave up on MoE.forward")]
    assert len(notes) == 1 and "MoE.forward" in html, text  # the router and the dispatch ran eager: said
    assert "graph break in loop" in notes[0] and "nonzero" in notes[0] and len(notes[0]) < 600, notes
    _timed_as_compile(v)  # the experts' forward: compiled as torch.compile(moe) compiles them
    assert v.gave_up_on == ["MoE.forward"] and "1 function eager" in v.flags()
    assert f"({v.graph_calls} compiled graph calls per run)" in notes[0]


def test_an_lstm_inside_a_submodule_breaks_the_graph_and_the_rest_is_compiled(shell):
    r, captured = _compare(shell, LSTM_IN_ENCODER, "eager,compile", "with torch.no_grad():\n    y = tagger(seq)\ny")
    v = r["compile"]
    text, _ = _shown(captured)
    assert "compile: dynamo gave up on Encoder.forward" in text, text  # the LSTM ran eager: said
    assert "Attempted to wrap RNN, GRU, or LSTM" in text and "allow_rnn=True" in text
    _timed_as_compile(v)  # embed+tanh and the head: graphs on both sides of the LSTM
    assert v.graphs >= 2 and v.graph_calls >= 2 and v.gave_up_on == ["Encoder.forward"]


def test_an_lstm_dynamo_gives_up_on_is_not_compiled_nor_timed_as_compile_nor_by_a_later_variant(shell):
    """Dynamo gives up on Lstm.forward in compile's first run and never tries it again: compile+amp, run
    after it, compiles nothing and counts nothing, and is not compiled either."""
    r, captured = _compare(shell, PLAIN_LSTM, "eager,compile,compile+amp",
                           "with torch.no_grad():\n    y = lstm(seq)\ny")
    assert r["eager"].ok and r["eager"].median_s > 0
    for name in ("compile", "compile+amp"):
        v = r[name]
        assert not v.ok and v.fell_back and v.graph_calls == 0 and v.outcome == "not compiled"
        assert v.speedup is None and v.ci is None and v.median_s is None and v.samples_s == []
        assert v.compile_s is None and v.max_rel_err is None and v.compile_cache is None
        assert v.error.startswith("dynamo gave up on Lstm.forward (") and "Attempted to wrap RNN" in v.error
    assert "earlier in this process, and never tries that code again" in r["compile+amp"].error
    assert r.best.name == "eager" and r.to_dict()["best"] == "eager"
    text, html = _shown(captured)
    assert "compile not compiled: dynamo gave up on Lstm.forward" in r.headline()
    assert "faster" not in r.headline() and "slower" not in r.headline()
    rows = [line for line in text.splitlines() if line.startswith(("  compile ", "  compile+amp "))]  # the table's
    assert len(rows) == 2 and all(row.rstrip().endswith("not compiled") and "×" not in row for row in rows), rows
    assert "not compiled: dynamo gave up on Lstm.forward" in html
    with torch.no_grad():  # the cell's variable is eager's, from the weights as they were
        assert torch.equal(shell.user_ns["y"], shell.user_ns["lstm"](shell.user_ns["seq"]))


def test_a_ctrl_c_in_the_run_that_counts_compiled_graphs_stops_its_profiler_and_restores_the_model(shell):
    """The run read under the profiler (the evidence of compiled graphs) is cut by a Ctrl-C landing as the
    model's forward starts, where a real SIGINT's handler runs: the profiler is stopped, fd 2 is back, the
    weights are as they were, and the cell compares again."""
    import os
    import signal
    import sys

    assert shell.run_cell(PLAIN_LSTM).success
    forward = shell.user_ns["Lstm"].forward.__code__
    weights = [p.detach().clone() for p in shell.user_ns["lstm"].parameters()]
    fired = []

    def counting_compiled_graphs(frame) -> bool:  # under compiled_calls, not the peak's profiler
        while frame is not None and not isinstance(frame.f_locals.get("scope"), compiled_calls):
            frame = frame.f_back
        return frame is not None

    def tracer(frame, event, arg):
        if not fired and event == "call" and frame.f_code is forward and counting_compiled_graphs(frame):
            assert torch.autograd._profiler_enabled()
            fired.append(frame.f_lineno)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)

    stderr_fd = os.fstat(2)
    sys.settrace(tracer)
    try:
        result, _ = run(shell, "%%amp_compare --variants eager,compile --runs 2 --warmup 0 -o r\nlstm(seq)")
    finally:
        sys.settrace(None)
    assert fired and isinstance(result.error_in_exec, KeyboardInterrupt)
    assert not torch.autograd._profiler_enabled() and os.fstat(2).st_ino == stderr_fd.st_ino
    assert all(torch.equal(a, b) for a, b in zip(weights, shell.user_ns["lstm"].parameters()))
    assert shell.user_ns["lstm"].__class__.__name__ == "Lstm"  # no compiled wrapper left under its name
    result, _ = run(shell, f"%%amp_compare --variants eager,compile {QUICK}\nlstm(seq)")
    assert result.success and shell.user_ns["r"]["compile"].outcome == "not compiled"
