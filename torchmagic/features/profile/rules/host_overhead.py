"""The host holding the step back: syncs that stall the device's queue (.item(), .tolist(), nonzero), and
many short ops from Python whose dispatch overhead outweighs their work."""

from __future__ import annotations

import statistics

from ....core.expectations import Expectation, measured
from ..libraries import library_call, library_fix, possessive
from ..regions import EVALUATION, parts
from ..result import Finding
from ..summary import TraceSummary, largest
from ..user import UserSetup
from .context import RuleContext
from .findings import THRESHOLDS, Advice, fmt_per_step, make_finding, share_of_step
from .gpu_work import gpu_waiting_share


def sync(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """Host reads of tensor values (.item(), .tolist(), print, nonzero) and explicit syncs: each one waits
    for the device's queue to drain."""
    per_step = (s.sync_calls + s.device_read_calls) / s.steps
    blocking_us = s.sync_us + s.sync_runtime_us + s.device_read_us
    share = share_of_step(blocking_us, s)
    if per_step < THRESHOLDS["sync_calls_per_step"] and share < THRESHOLDS["sync_block_share"]:
        return None
    title, share, expected = _sync_cost(s, ctx, per_step, share)
    evidence = {"syncs_per_step": round(per_step, 2), "blocking_ms_per_step": round(blocking_us / s.steps / 1e3, 3),
                "share_of_step": round(share, 4), "sync_runtime_calls": s.sync_runtime_calls,
                "device_to_host_copies_per_step": round(s.device_read_calls / s.steps, 2)}
    inside = library_call(s.syncs_in_library, s.sync_calls)
    if inside is not None:
        package, function = inside
        fix, snippet = library_fix(package, function, ctx.user.model)
        evidence["inside"] = f"{package}.{function}"
        title += (f"; {fmt_per_step(largest(s.syncs_in_library, 1)[0][1] / s.steps)} of "
                  f"them inside {possessive(package)} {function}")
        return make_finding("sync", ctx, share, title, evidence, Advice(fix, snippet, expected))
    split = parts(s)
    if split is not None and split[EVALUATION].sync_calls:
        by_part = {name: round(part.sync_calls / s.steps, 2) for name, part in split.items()}
        evidence["syncs_per_step_by_part"] = by_part
        title += " ({} in the training part, {} in the evaluation part)".format(*map(fmt_per_step, by_part.values()))
        if split[EVALUATION].sync_calls * 2 >= s.sync_calls:
            return make_finding("sync", ctx, share, title, evidence, _evaluation_metrics(ctx.user, expected))
    return make_finding("sync", ctx, share, title, evidence, _running_values(ctx.user, expected))


def _sync_cost(s: TraceSummary, ctx: RuleContext, per_step: float,
               share: float) -> tuple[str, float, Expectation]:
    """The sync finding's title, the share of the step the syncs cost, and what removing them brings:
    on CPU little; on a GPU the time the host blocks, or only the time the GPU then waits, where less."""
    expected = Expectation.removing(share, "the time the host blocks on them")
    if not ctx.accelerator:
        title = (f"{fmt_per_step(per_step)} host reads of tensor values per step (.item(), .tolist(), nonzero): "
                 "free on CPU, a full pipeline stall each on a GPU")
        share = min(share, THRESHOLDS["severity_medium"] - 1e-9)  # cheap here: never above 'low'
    elif round(share, 2) == 0:
        title = (f"{fmt_per_step(per_step)} host-device syncs per step, each a stall of the device's queue (the host "
                 "waited little for them: the device had finished)")
    else:
        title = f"{fmt_per_step(per_step)} host-device syncs per step block the CPU for {share:.0%} of the step"
        if s.device_read_calls:
            title += (f" ({fmt_per_step(s.device_read_calls / s.steps)} of them copies to the host: .cpu(), "
                      ".tolist(), print)")
        starved = gpu_waiting_share(s, ctx)
        if starved is not None and starved < share:
            # a host blocked on a busy GPU costs the step only the time the GPU then waits for new launches
            title += f"; the GPU waits on the host {starved:.0%} of the step"
            share = starved
            expected = Expectation.removing(share, "the time the GPU waits on the host")
    return title, share, expected


def _evaluation_metrics(u: UserSetup, expected: Expectation) -> Advice:
    """The fix where most syncs are in the evaluation part: its metrics summed on the device."""
    return Advice(
        "Most of them are in the evaluation part: accumulate its metrics on the device and read the "
        "totals once, after the evaluation loop.",
        "correct = torch.zeros((), dtype=torch.long, device=device)\n"
        f"{u.model}.eval()\n"
        "with torch.inference_mode():\n"
        f"    for x, y in {u.loader}:   # the evaluation's loader\n"
        f"        correct += ({u.model}(x).argmax(1) == y).sum()   # no sync\n"
        f"accuracy = correct.item() / len({u.loader}.dataset)   # one sync\n"
        f"{u.model}.train()", expected,
    )


def _running_values(u: UserSetup, expected: Expectation) -> Advice:
    """The fix for syncs in the training loop: running values kept on the device, read now and then."""
    return Advice(
        "Keep running values on the device and read them once per step (or every N steps); "
        "avoid .item()/.tolist()/print(tensor) and data-dependent shapes (nonzero, masked_select) inside the loop.",
        "running_loss = torch.zeros((), device=device)\n"
        f"for step, (x, y) in enumerate({u.loader}):\n"
        "    loss = train_step(x, y)\n"
        "    running_loss += loss.detach()          # no sync\n"
        "    if step % 50 == 0:\n"
        "        print(running_loss.item() / 50)    # one sync every 50 steps\n"
        "        running_loss.zero_()", expected,
    )


def dispatch_bound(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """Many short ops from Python, judged per part of the step where it trains and evaluates (regions.py):
    an evaluation pass of tiny ops is not hidden by the big matmuls of the training beside it, and the
    other way round: a part is judged on its own time, its severity on the step's.  Where both parts are
    overhead-bound, or neither, or the step is one part, the step is judged."""
    bound = [(p, judged) for p in (parts(s) or {}).values() if (judged := _overhead(p.op_us, p.gap_us, s, p.time_us))]
    part, judged = bound[0] if len(bound) == 1 else (None, _overhead(s.python_op_us, s.category_us["other"], s))
    if judged is None:
        return None
    per_step, median, share = judged
    if ctx.accelerator and not s.has_device_events:
        return None  # the host's overhead matters where the device waits for it: without its work, no telling
    starved = gpu_waiting_share(s, ctx)
    if starved is not None:
        # On a GPU the host's overhead costs only the time the GPU waits for it: none while kernels queue
        if starved < THRESHOLDS["dispatch_small_op_share"]:
            return None
        share = min(share, starved)
    where = f" {part.name} part" if part is not None else ""
    title = f"Overhead-bound{where}: {fmt_per_step(per_step)} ops per step from Python, median {median:.1f} µs each"
    evidence = {"ops_per_step": round(per_step, 1), "median_op_us": round(median, 2),
                "python_and_small_op_share": round(share, 4)}
    if starved is not None:
        evidence["gpu_waiting_share"] = round(starved, 4)
        title += f"; the GPU waits for them {starved:.0%} of the step"
    if part is not None:
        evidence["part"] = part.name
        evidence["part_share_of_step"] = round(share_of_step(part.time_us, s), 4)
    inside = library_call(s.python_ops_in_library, s.python_ops)
    if inside is not None:
        package, function = inside
        fix, snippet = library_fix(package, function, ctx.user.model)
        evidence["inside"] = f"{package}.{function}"
        return make_finding("dispatch_bound", ctx, share, f"{title}, most inside {possessive(package)} {function}",
                            evidence, Advice(fix, snippet))
    advice, compile_measured = _compile_or_batch(ctx)
    evidence.update(compile_measured)
    return make_finding("dispatch_bound", ctx, share, title, evidence, advice)


def _compile_or_batch(ctx: RuleContext) -> tuple[Advice, dict]:
    """The fix for overhead-bound code, and the evidence it rests on: compile it, unless %%amp_compare
    measured torch.compile not to pay on this code; then give each op more work."""
    target = "CUDA graphs (mode='reduce-overhead')" if ctx.captures_cuda_graphs else "fused kernels"
    snippet = f"{ctx.user.model} = torch.compile({ctx.user.model})  # pays off after the compile cost is amortised; measure it"
    verdict = measured("dispatch_bound", ctx.code)  # what %%amp_compare measured torch.compile at on this code
    if verdict is None:
        # Whether compiling pays is not in the trace: a compiled call has its own fixed cost (guards, a wrapper
        # and, with autograd on, an autograd function around the graph), which on the tour's 200 one-item calls
        # made it 0.47x on an AMX Xeon.  So no figure is predicted until %%amp_compare has measured it.
        fix = (f"Each op pays Python and dispatcher overhead; the work per op is too small to hide it. "
               "Give each op more work (batch the items a loop handles one at a time, larger batches, vectorise "
               f"Python loops over tensors), or compile the step so many small ops become {target}. A compiled call "
               "has its own fixed cost (guards, a wrapper; with autograd on, an autograd function around the graph): "
               "whether compiling pays here is not in the trace, so the verify command measures it.")
        return Advice(fix, snippet), {}
    low, high = verdict.ci
    evidence = {"compile_measured": [round(verdict.speedup, 3), round(low, 3), round(high, 3)]}
    if low <= 1.0:  # compiling did not pay here: the other fix
        fix = (f"Each op pays Python and dispatcher overhead; the work per op is too small to hide it. "
               f"torch.compile measured {verdict.speedup:.2f}x on this code (95% CI {low:.2f}-{high:.2f}x, "
               "%%amp_compare): give each op more work instead: batch the requests or items a loop handles one "
               "at a time, and vectorise Python loops over tensors.")
        return Advice(fix, ""), evidence  # how to batch depends on the loop, which the trace does not show
    fix = (f"Each op pays Python and dispatcher overhead; the work per op is too small to hide it. Compile the "
           f"step so many small ops become {target}: torch.compile measured {verdict.speedup:.2f}x on this code "
           f"(95% CI {low:.2f}-{high:.2f}x, %%amp_compare).")
    expected = Expectation(round(low, 2), round(high, 2), "%%amp_compare measured it on this code")
    return Advice(fix, snippet, expected), evidence


def _overhead(op_us: list[float], python_us: float, s: TraceSummary,
              part_us: float | None = None) -> tuple[float, float, float] | None:
    """(ops per step, median op µs, share of the step in short ops and the Python between them) for ops
    called from Python, when they are many, short, and take enough of their part of the step (all of it
    unless ``part_us``) to be worth compiling."""
    per_step = len(op_us) / s.steps
    if not op_us or per_step < THRESHOLDS["dispatch_ops_per_step"]:
        return None
    median = statistics.median(op_us)
    if median > THRESHOLDS["dispatch_median_op_us"]:
        return None
    overhead = sum(d for d in op_us if d <= THRESHOLDS["dispatch_median_op_us"]) + python_us
    part_us = s.steady_step_us if part_us is None else part_us
    if part_us <= 0 or overhead / part_us < THRESHOLDS["dispatch_small_op_share"]:
        return None
    return per_step, median, share_of_step(overhead, s)
