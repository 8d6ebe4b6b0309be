"""torchmagic.compare with real torch.compile (inductor on the CPU): compile cost, graph breaks,
recompiles, the recompile limit, and that no compiled wrapper outlives the comparison.

Each test defines its own module class: dynamo caches compiled code per class's forward, so a
shared class would make later tests see code compiled by earlier ones.
"""

import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo
from torch import nn

import torchmagic
from torchmagic.core.settings import TorchSettings

pytestmark = pytest.mark.slow


def test_compile_and_compile_amp_on_a_training_step():
    class Mlp(nn.Sequential):
        pass

    torch.manual_seed(0)
    net = Mlp(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 8)

    def step(m):
        opt.zero_grad()
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    before = [p.detach().clone() for p in net.parameters()]
    settings, limit = TorchSettings.capture(), torch._dynamo.config.recompile_limit
    r = torchmagic.compare(step, model=net, variants="eager,compile,compile+amp", runs=6, warmup=1)
    for name in ("compile", "compile+amp"):
        v = r[name]
        assert v.ok and not v.fell_back and v.graphs >= 1, v.notes
        assert v.compile_cache in ("cold", "warm disk cache") and v.compile_s > 0.05
        assert v.compile_s == pytest.approx(v.first_call_s - v.median_s)
        assert v.ci is not None and v.numerics_ok, (v.max_rel_err, v.notes)
        assert v.recompiles == 0
        if v.verdict == "faster":
            assert v.break_even_runs >= 1
        else:
            assert v.break_even_runs is None
    assert r["compile+amp"].precision == "bf16" and r["compile"].max_rel_err < 1e-4
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert type(net) is Mlp and opt.state_dict()["state"] == {}
    assert TorchSettings.capture() == settings and torch._dynamo.config.recompile_limit == limit
    assert torch._dynamo.config.fail_on_recompile_limit_hit is False

    # compiled again in the same process: dynamo reuses what it compiled, and says so
    again = torchmagic.compare(step, model=net, variants="eager,compile", runs=2, warmup=0)
    assert again["compile"].compile_cache == "in memory"
    assert "not a fresh compile" in " ".join(again["compile"].notes)


def test_recompiles_during_the_runs_are_detected():
    class Tagged(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x, tag):
            scale = 2.0 if tag.startswith("double") else 1.0  # dynamo specialises on the string
            return self.linear(x) * scale

    net, x = Tagged(), torch.randn(4, 8)
    tags = itertools.cycle(["double-a", "single-b", "double-c"])
    with torch.no_grad():
        r = torchmagic.compare(lambda m: m(x, next(tags)), model=net, variants="eager,compile", runs=4, warmup=1)
    v = r["compile"]
    assert v.ok and v.recompiles >= 1 and f"recompiled {v.recompiles}×" in v.flags()
    assert "recompile_limit" in " ".join(v.notes)


def test_hitting_the_recompile_limit_fails_the_variant_instead_of_running_eager():
    class Fresh(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x, tag):
            return self.linear(x) * (2.0 if tag.endswith("0") else 1.0)

    net, x = Fresh(), torch.randn(4, 8)
    counter = itertools.count()
    with torch._dynamo.config.patch(recompile_limit=2), torch.no_grad():
        r = torchmagic.compare(lambda m: m(x, f"run{next(counter)}"), model=net, variants="eager,compile",
                               runs=3, warmup=0)
        assert torch._dynamo.config.recompile_limit == 2
    v = r["compile"]
    assert not v.ok and "recompile limit" in v.error and v.speedup is None
    assert r.best.name == "eager"


def test_graph_breaks_are_counted_and_named():
    class Chatty(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            x = self.a(x)
            torch._dynamo.graph_break()
            return self.b(x)

    net, x = Chatty(), torch.randn(4, 8)
    with torch.no_grad():
        r = torchmagic.compare(lambda m: m(x), model=net, variants="eager,compile", runs=2, warmup=0)
    v = r["compile"]
    assert v.ok and v.graph_breaks >= 1 and v.graphs >= 2
    assert any("graph break" in note for note in v.notes)


def test_the_magic_never_leaves_a_compiled_model_behind(shell):
    shell.run_cell("""
from torch import nn
class Small(nn.Sequential):
    pass
torch.manual_seed(0)
net = Small(nn.Linear(16, 16), nn.Tanh())
x = torch.randn(4, 16)
original = net
""")
    result = shell.run_cell("%%amp_compare --variants eager,compile --runs 2 --warmup 0 -o r -q\nout = net(x)\nout")
    assert result.success, result.error_in_exec
    ns = shell.user_ns
    assert ns["net"] is ns["original"] and ns["r"]["compile"].ok
    assert torch.equal(ns["out"], ns["original"](ns["x"]))  # eager's output, not a compiled one


def test_a_second_compare_in_the_notebook_reuses_the_compiled_code(shell):
    shell.run_cell("""
from torch import nn
class Reused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
    def forward(self, x):
        return torch.sigmoid(self.fc(x)) * torch.tanh(x)
m, x = Reused(), torch.randn(4, 16)
""")
    for name in ("r1", "r2"):
        result = shell.run_cell(f"%%amp_compare --variants eager,compile --runs 2 --warmup 0 -q -o {name}\nm(x)")
        assert result.success, result.error_in_exec
    assert shell.user_ns["r2"]["compile"].compile_cache == "in memory"  # dynamo's helper globals were kept


def test_code_compiled_here_with_cuda_graphs_is_dropped_and_the_users_own_kept(monkeypatch):
    """On a (fake) CUDA device: every run of a reduce-overhead variant marks a cudagraph-trees step
    and the user's step count is put back; afterwards the code the comparison compiled with CUDA
    graphs has left dynamo's cache (with it go its graphs and their pool), while a model the user
    compiled with CUDA graphs before runs on without recompiling.  (Inductor records no graphs for
    CPU tensors, so the pool is 0 here.)"""
    from torch._inductor import cudagraph_trees

    from torchmagic.features.compare.compile_watch import compile_counts
    from torchmagic.features.compare.variants import _cache_entries, _records_cuda_graphs

    from ..fakes import FakeGraphCudaDevice

    class Compared(nn.Sequential):
        pass

    class Users(nn.Sequential):
        pass

    def live_graph_entries():
        return sum(1 for e in _cache_entries() if _records_cuda_graphs(e.backend))

    x = torch.randn(4, 8)
    users = torch.compile(Users(nn.Linear(8, 8)), mode="reduce-overhead")
    users(x)
    before, step = live_graph_entries(), cudagraph_trees.MarkStepBox.mark_step_counter
    marks, mark = [], torch.compiler.cudagraph_mark_step_begin
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: (marks.append(1), mark()))

    with torch.no_grad():
        r = torchmagic.compare(lambda m: m(x), model=Compared(nn.Linear(8, 8), nn.ReLU()), runs=2, warmup=1,
                               variants="eager,compile:reduce-overhead", device=FakeGraphCudaDevice())
    v = r["compile:reduce-overhead"]
    assert v.ok and v.graphs >= 1 and not v.fell_back and v.graph_pool_bytes == 0
    assert any(note.startswith("inductor left 1 of its graphs without CUDA graphs") for note in v.notes), v.notes
    assert len(marks) >= 1 + 1 + 1 + 2 and cudagraph_trees.MarkStepBox.mark_step_counter == step
    assert live_graph_entries() == before  # the comparison's compiled code is gone, the user's is not
    counts = compile_counts()
    users(x)
    assert (compile_counts() - counts).frames == 0


FIRST_COMPILE = textwrap.dedent("""
    import json, sys
    import torch
    from torch import nn
    import torchmagic

    assert "torch._inductor.compile_fx" not in sys.modules, "inductor loaded before the comparison"
    net, x = nn.Linear(8, 8), torch.randn(4, 8)
    with torch.no_grad():
        first = torchmagic.compare(lambda m: m(x), model=net, variants="eager,compile,compile+amp", runs=2,
                                   warmup=0)
        again = torchmagic.compare(lambda m: m(x), model=nn.Linear(8, 8), variants="eager,compile", runs=2,
                                   warmup=0)
    print(json.dumps({"first": {v.name: v.notes for v in first.variants},
                      "again": {v.name: v.notes for v in again.variants}}))
""")


def test_the_first_compile_in_a_fresh_process_says_it_includes_loading_inductor():
    """Measured, not assumed: whether inductor was loaded is read before torch.compile() (which
    imports it), so only the process's first compile says so, with what its torch.compile call took."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", FIRST_COMPILE], capture_output=True, text=True, timeout=600,
                          cwd=root, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    notes = json.loads(done.stdout.strip().splitlines()[-1])

    def loading(variant_notes):
        return [n for n in variant_notes if "loading inductor" in n]

    (note,) = loading(notes["first"]["compile"])
    assert note.startswith("the first compile in this process: its one-time cost includes loading inductor "
                           "(the torch.compile call alone took ")
    assert note.endswith("), which later compiles in this process skip")
    assert loading(notes["first"]["compile+amp"]) == [] and loading(notes["first"]["eager"]) == []
    assert loading(notes["again"]["compile"]) == []  # a second comparison in the same process
