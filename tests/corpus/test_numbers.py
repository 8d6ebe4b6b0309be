"""The numbers a user can check, on models nobody here wrote (tests/corpus/models.py): ``--flops``
against ``torch.utils.flop_counter.FlopCounterMode``, ``--memory``'s peak against the profiler's own
allocation events, and the modules named as the model names them, with ``--memory --stack`` on."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.features.profile.flops import CPU_ATTENTION

from .models import BUILDERS, build

TOLERANCE = 0.05  # the bar; the counts agree exactly and the peaks to the byte here


def _training_step(name):
    work = build(name)
    model = work.model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = model(**work.batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()  # AdamW's state exists before anything is measured
    return model, step


def _reference_peak(step) -> int:
    """The level of torch's CPU allocations over one step, above where it started, from the profiler's own
    events: the allocator's running total they carry (not their sizes summed), with the step before
    recorded so the frees of what it allocated are seen."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
        with torch.profiler.record_function("measured step"):
            step()
    results = prof.profiler.kineto_results
    window = next(e for e in prof.events() if e.name == "measured step").time_range
    start, end = (results.trace_start_ns() + t * 1000 for t in (window.start, window.end))
    totals, pending = [], list(results.experimental_event_tree())
    while pending:
        node = pending.pop()
        pending.extend(node.children)
        if node.tag.name == "Allocation":
            totals.append((node.start_time_ns, node.extra_fields.total_allocated))
    totals.sort()
    before = [total for t, total in totals if t < start][-1]
    return max(total for t, total in totals if start <= t <= end) - before


@pytest.mark.slow  # 4-11 s: the fast lane (-m "not slow") stays under 5 minutes
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_flops_and_the_memory_peak_agree_with_torchs_own_counts(name):
    model, step = _training_step(name)
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        step()
    r = torchmagic.profile(step, flops=True, steps=1, device=CpuDevice())
    counted = sum(op.flops for op in r.ops)
    assert counted == pytest.approx(counter.get_total_flops(), rel=TOLERANCE)
    assert counted > 0 and r.roofline and r.mfu > 0

    expected = _reference_peak(step)
    r = torchmagic.profile(step, memory=True, stack=True, warmup=1, steps=1, device=CpuDevice())
    assert r.memory_peak_bytes["cpu"] == pytest.approx(expected, rel=TOLERANCE)
    assert not any("peak reads high" in note for note in r.notes)  # exact with a warm-up: no caveat

    # the model's modules as it names them (named_modules), never the tracer's "Linear_3"; a module the
    # forward makes as it runs (BERT's CrossEntropyLoss) has no name but the tracer's
    modules = [label for label, _ in r.hot_lines if label.startswith("nn.Module: ")]
    classes = {type(m).__name__ for m in model.modules()}
    unnamed = [label for label in modules if not label.startswith("nn.Module: model")]
    assert modules and not [label for label in unnamed if label[11:].rsplit("_", 1)[0] in classes], unnamed
    assert all(a.module is None or a.module.startswith("model") for a in r.largest_allocations)


def test_without_a_warm_up_the_cpu_peak_says_what_it_may_count_twice():
    _, step = _training_step("gpt2")
    r = torchmagic.profile(step, memory=True, steps=1, device=CpuDevice())
    assert any("peak reads high by what the first step frees" in note for note in r.notes)
