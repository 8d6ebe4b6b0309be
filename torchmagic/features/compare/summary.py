"""A variant as it is measured, and what its measurements come to: its median and its speedup over
eager with a 95% CI, the one-time cost and the runs after which it pays off, what its compile did;
what the timed rounds that ran can say; and the speedups kept for the profile rules to read."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...core.expectations import remember
from ...core.measure import Rounds, min_pairs, paired_ratio, summarize
from ...core.outcome import Outcome
from .compile_watch import (CompileCounts, CompiledCalls, describe_gave_up, given_up_now, label_of, model_functions,
                            not_compiled_reason)
from .result import CompareResult, VariantResult
from .variants import Variant

# Noted where the timed rounds' threads waited for a CPU this share of their ready time or more: 0.3% on the free
# 2-core machine, 33% with one busy loop on one core; there BERT's intervals widened from ~2-3% to 57-97%.
CPU_WAIT_NOTED = 0.1


@dataclass
class MeasuredVariant:
    """A variant while it is being measured: its built model and what was seen so far."""

    variant: Variant
    out: VariantResult
    built: Any = None
    call_s: float = 0.0   # its fastest untimed run: sizes its timed blocks
    calls: int = 1        # calls per timed block
    counts: CompileCounts = field(default_factory=CompileCounts)

    def fail(self, message: str) -> None:
        self.out.ok = False
        self.out.error = message
        self.built = None

    def not_compiled(self, reason: str) -> None:
        """A compiled variant that ran no compiled graph: not timed, and no figure of its eager runs kept
        (its error against eager would read as the compile's)."""
        self.fail(reason)
        self.out.fell_back = True
        self.out.max_abs_err = self.out.max_rel_err = self.out.numerics_ok = self.out.tolerance = None


def rounds_notes(run: Outcome, rounds: Rounds, variants: int) -> list[str]:
    """What the timed rounds that ran can say: too few for an interval, a busy machine, or cut short."""
    notes = []
    blocks = len(rounds.block_lengths(rounds.done))
    if 0 < blocks < min_pairs() and variants > 1:
        notes.append(f"{rounds.done} rounds in {blocks} blocks give no 95% confidence interval (it takes "
                     f"{min_pairs()} blocks), so no variant is called faster or slower: the figures are a first look")
    if rounds.cpu_wait is not None and rounds.cpu_wait >= CPU_WAIT_NOTED:
        notes.append(f"the machine was busy: this process's threads waited for a CPU {rounds.cpu_wait:.0%} of the time "
                     "they were ready to run in the timed rounds (other processes, or more threads than cores), so "
                     "the timings are noisier and the intervals wider than on free cores; free them, or give the "
                     "comparison more time (--min-time)")
    if isinstance(run.error, KeyboardInterrupt):
        notes.append(f"interrupted after {rounds.done} rounds: the figures cover what ran")
    elif run.error is not None:
        notes.append(f"eager failed in timed round {rounds.done + 1}: the figures cover the rounds before")
    return notes


def record_compile(entry: MeasuredVariant, first: CompileCounts, since_build: CompileCounts, calls: CompiledCalls,
                   model: Any) -> bool:
    """What a compiled variant's first run compiled (its graphs, breaks, cache, the functions dynamo gave
    up on) and what one run after its warm-up executed of it (``calls``, the profiler's count): whether
    it ran compiled graphs.  When it ran none, it is marked not compiled, with dynamo's reasons from all
    its runs since it was built (``since_build``)."""
    out = entry.out
    out.graphs, out.graph_breaks, out.graph_calls = first.graphs, first.graph_breaks, calls.graphs
    if calls.graphs == 0:
        entry.not_compiled(not_compiled_reason(since_build, model))
        return False
    functions = model_functions(model)
    gave_up = first.gave_up + given_up_now(functions)  # now, or in an earlier variant: then never tried again
    if first.frames == 0:
        out.compile_cache = "in memory"
        out.notes.append("reused code compiled earlier in this kernel: the one-time cost shown is not a "
                         "fresh compile (a new process pays it again)")
    else:
        out.compile_cache = "warm disk cache" if first.cache_hits and not first.cache_misses else "cold"
        if out.compile_cache != "cold":
            out.notes.append("inductor's on-disk cache held these graphs: a cold compile takes longer")
    if gave_up:
        out.gave_up_on = list(dict.fromkeys(label_of(g, functions) for g in gave_up))
        out.notes.append(f"dynamo gave up on {describe_gave_up(gave_up, functions)} — "
                         f"{'that function runs' if len(out.gave_up_on) == 1 else 'those functions run'} eager, "
                         f"and only the code called from there is compiled ({calls.graphs} compiled graph "
                         f"call{'s' if calls.graphs != 1 else ''} per run)")
    if first.graph_breaks:
        reasons = "; ".join(first.break_reasons[:2]) or "see torch._dynamo.explain"
        out.notes.append(f"{first.graph_breaks} graph break{'s' if first.graph_breaks != 1 else ''} "
                         f"({reasons}): code between graphs runs eager")
    return True


def summarise(measured: list[MeasuredVariant], rounds: Rounds) -> None:
    """Medians, speedups (median per-round ratios) with their CIs, one-time costs and break-even."""
    if not measured:
        return
    base = rounds.samples[0]
    for entry, samples in zip(measured, rounds.samples):
        out = entry.out
        out.samples_s, out.calls_per_sample = list(samples), entry.calls
        summary = summarize(samples)
        if summary is None or not out.ok:  # failed mid-way: its partial times are not compared
            continue
        out.median_s, out.iqr_s = summary.median, summary.iqr
        if entry.variant.is_baseline:
            out.speedup = 1.0
            continue
        n = min(len(base), len(samples))  # rounds both completed, paired by index
        if n == 0:
            continue
        base_median, median = summarize(base[:n]).median, summarize(samples[:n]).median
        ratio = paired_ratio(base[:n], samples[:n], blocks=rounds.block_lengths(n))
        out.speedup, out.ci = ratio.estimate, ratio.ci
        if entry.variant.compiles or any(t.build for t in entry.variant.techniques):
            out.compile_s = max(out.first_call_s - out.median_s, 0.0)
            if out.ci is not None and out.ci[0] > 1:
                out.break_even_runs = max(1, math.ceil(out.compile_s / (base_median - median)))
        if entry.variant.compiles:
            out.recompiles = entry.counts.frames
            if entry.counts.frames:
                out.notes.append(f"recompiled {entry.counts.frames}× after its first run: what the compiled code was "
                                 "specialised on (shapes, Python values) keeps changing; each recompile costs a "
                                 "compile, and past torch._dynamo.config.recompile_limit dynamo runs eager")


# The %%torchprofile rule whose finding each variant verifies (other variants are kept under their own name)
VERIFIED_RULE = {"amp": "amp", "compile": "dispatch_bound", "inference_mode": "inference_grad"}


def remember_measured(result: CompareResult, key: str | None) -> None:
    """Keep each variant's measured speedup for the profile rule that predicts it, so the next profile
    of this code reads the measurement instead of repeating a prediction."""
    expected = result.expectation_check.expected if result.expectation_check else None  # one variant then
    for v in result.variants[1:]:
        if (measured := v.measured(expected)) is not None:
            remember(VERIFIED_RULE.get(v.name, v.name), key, measured)
