"""Sync and dispatch findings per part of the step: a cell that trains and then evaluates (with grad
on) is judged part by part, on real CPU profiles."""

import torch

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.features.profile import regions, rules
from torchmagic.features.profile.rules import host_overhead
from torchmagic.features.profile.summary import TraceSummary
from torchmagic.features.profile.live_table import summarize_live


def _cell(train: str, evaluate: str, batches: int = 12):
    """One step of a notebook cell: a training step (``big``: a few wide matmuls; ``deep``: 120 layers of
    mid-sized ones), then an evaluation pass over ``batches`` batches (``big``, ``tiny`` ops in a
    decoding-like loop, an ``.item()`` per batch, or that ``under no_grad``)."""
    torch.manual_seed(0)
    wide = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    deep = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(120)])
    small = torch.nn.Linear(8, 8)
    model = wide if train == "big" else deep
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x_train = torch.randn(256, 512) if train == "big" else torch.randn(64, 256)
    batches = [torch.randn(4, 8) for _ in range(batches)]

    def forward_tiny(x):
        for _ in range(3):
            x = torch.tanh(small(x)) * 0.5 + 0.1
        return x

    def step():
        loss = model(x_train).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if evaluate == "big":
            wide(torch.randn(256, 512)).argmax(1)
        for x in batches:
            if evaluate == "tiny":
                forward_tiny(x)
            elif evaluate == "item":
                (small(x).argmax(1) == 0).sum().item()
            elif evaluate == "item under no_grad":
                with torch.no_grad():
                    (small(x).argmax(1) == 0).sum().item()

    return step


def _profile(step):
    return torchmagic.profile(step, device=CpuDevice(), warmup=1, steps=2)


def _summary(step) -> TraceSummary:
    step()  # warm-up, as %%torchprofile's
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(2):
            with torch.profiler.record_function(f"ProfilerStep#{i}"):
                step()
    results = prof.profiler.kineto_results
    return summarize_live(results)[0]


def test_the_parts_are_told_apart_by_the_graph_nodes_backward_used():
    split = regions.parts(_summary(_cell("big", "item")))
    assert split is not None
    training, evaluation = split[regions.TRAINING], split[regions.EVALUATION]
    # 12 batches a step, 2 steps: every .item() of the evaluation loop is in the evaluation part
    assert evaluation.sync_calls == 24 and training.sync_calls == 0
    assert training.median_op_us > evaluation.median_op_us  # the wide matmuls train
    # an evaluation under no_grad leaves no graph node to tell it by: one part, as documented
    no_grad = regions.parts(_summary(_cell("big", "item under no_grad")))
    assert no_grad is None or no_grad[regions.EVALUATION].sync_calls == 0
    assert regions.parts(_summary(_cell("big", "none"))) is None  # nothing goes unused


def test_syncs_in_the_evaluation_part_get_the_evaluation_fix():
    f = _profile(_cell("big", "item")).finding("sync")
    assert f is not None
    assert f.evidence["syncs_per_step_by_part"] == {"training": 0.0, "evaluation": 12.0}
    assert f.title.endswith("(0 in the training part, 12 in the evaluation part)")
    assert "correct +=" in f.snippet and "inference_mode" in f.snippet and "evaluation part" in f.fix


def test_a_tiny_op_evaluation_beside_deep_training_is_overhead_bound_on_its_own():
    # 48 batches: an evaluation part of a few ms lost its finding to one preemption on a loaded CI (a tiny op
    # the scheduler stopped for a timeslice reads as a long op); ~20 ms a step averages them out
    step = _cell("deep", "tiny", batches=48)
    s = _summary(step)
    # judged as one step, the training's 120 matmuls a step hide the evaluation's 144 tiny ops
    assert host_overhead._overhead(s.python_op_us, s.category_us["other"], s) is None
    f = _profile(step).finding("dispatch_bound")
    assert f is not None
    assert f.evidence["part"] == "evaluation" and f.title.startswith("Overhead-bound evaluation part: ")
    assert f.evidence["ops_per_step"] >= 48 * 3 * 4  # linear, tanh, mul, add per iteration
    assert f.evidence["median_op_us"] <= rules.THRESHOLDS["dispatch_median_op_us"]
    assert 0 < f.evidence["python_and_small_op_share"] <= f.evidence["part_share_of_step"] < 0.5
    assert f.severity != "high"  # a small part of the step


def test_big_ops_in_both_parts_are_not_overhead_bound():
    assert _profile(_cell("big", "big")).finding("dispatch_bound") is None


def test_a_summary_built_from_numbers_is_one_part():
    s = TraceSummary(step_us=[1000.0], python_ops=200, python_op_us=[2.0] * 200, backward_events=3)
    assert regions.parts(s) is None
    f = rules.dispatch_bound(s, rules.RuleContext("cpu", False, None, ""))
    assert f.title.startswith("Overhead-bound: 200 ops") and "part" not in f.evidence  # judged as one step


def test_metrics_logged_inside_training_are_not_an_evaluation_part():
    # a training loop that logs perplexity and accuracy with .item(): the exp() makes a graph node no
    # backward uses, yet it is no forward pass: the syncs are training's, not an evaluation loop's
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 32), torch.nn.Linear(32, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 100))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 100, (8, 16))
    log = []

    def step():
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 100), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.append((torch.exp(loss).item(), (logits.argmax(-1) == tokens[:, 1:]).float().mean().item()))

    s = _summary(step)
    assert s.sync_calls == 4  # two .item() a step
    assert regions.parts(s) is None  # one part: training
    finding = rules.sync(s, rules.RuleContext("cpu", False, None, ""))
    assert finding is None or "evaluation part" not in finding.title
