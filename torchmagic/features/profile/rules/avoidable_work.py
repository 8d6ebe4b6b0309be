"""Work the step does that a setting removes: autograd graphs no backward uses (inference or evaluation
with grad on), and an optimizer that loops over its parameters one small op at a time."""

from __future__ import annotations

from ....core.expectations import Expectation
from ..result import Finding
from ..summary import TraceSummary
from .context import RuleContext
from .findings import THRESHOLDS, Advice, fmt_per_step, make_finding, share_of_step


def inference_grad(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """Forward passes whose graph no backward uses: inference with autograd on, or, in a cell that
    also trains, its evaluation part (a graph node is a forward op's sequence number; each backward
    function carries the number of the node it differentiates)."""
    unused = s.graph_nodes - s.backward_nodes
    per_step = len(unused) / s.steps
    used = len(s.graph_nodes & s.backward_nodes) / s.steps
    if per_step < THRESHOLDS["inference_grad_nodes_per_step"]:
        return None
    if per_step < THRESHOLDS["inference_grad_unused_share"] * used:
        return None  # a stray node or two beside training (a running total kept with grad): not a forward pass
    unused_us = sum(s.graph_node_us.get(node, 0.0) for node in unused)
    if s.backward_events and share_of_step(unused_us, s) < THRESHOLDS["inference_grad_eval_share"]:
        return None
    share = 0.1 * share_of_step(unused_us or s.category_us["forward"], s)  # what autograd's bookkeeping costs
    model = ctx.user.model
    if s.backward_events:  # the cell also trains: this is its evaluation
        title = (f"Evaluation with autograd on: {fmt_per_step(per_step)} graph nodes per step come from a forward "
                 f"pass no backward uses ({share_of_step(unused_us, s):.0%} of the step)")
        fix = ("Run the evaluation part under torch.inference_mode() (torch.no_grad() if its outputs go back "
               "into training), with the model in eval mode: no graph, no saved activations.")
        snippet = f"{model}.eval()\nwith torch.inference_mode():\n    out = {model}(x)   # the evaluation pass\n{model}.train()"
    else:
        title = (f"Inference with autograd on: {fmt_per_step(per_step)} graph nodes per step are recorded and no "
                 "backward uses them")
        fix = "Run inference under torch.inference_mode(): no graph, no saved activations, less memory and time."
        snippet = f"with torch.inference_mode():\n    out = {model}(x)"
    # inference_mode only removes work, at most the ops that recorded the graph: a bound, not a figure
    building = share_of_step(unused_us, s)
    expected = (Expectation.removing(building, "the ops that recorded the unused graph")
                if not s.backward_events and unused_us else None)
    return make_finding(
        "inference_grad", ctx, share, title,
        {"unused_graph_nodes_per_step": round(per_step, 1), "used_graph_nodes_per_step": round(used, 1),
         "unused_ms_per_step": round(unused_us / s.steps / 1e3, 3), "backward_ops": s.backward_events},
        Advice(fix, snippet, expected),
    )


FUSED_ON_CPU = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})  # torch's optimizers with a fused CPU kernel


def optimizer(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """A per-parameter update loop.  On a GPU the multi-tensor (foreach) implementation is one kernel per
    op over all parameters; on the CPU its ops still loop over the tensors (AdamW's step: 2.6 ms against
    2.9 ms), and only the fused kernel is one pass (0.8 ms), so there foreach is no fix."""
    share = share_of_step(s.optimizer_us, s)
    ops_per_step = s.optimizer_ops / s.steps
    on_cpu = not ctx.accelerator
    vectorised = s.optimizer_fused or (s.optimizer_foreach and not on_cpu)
    if share < THRESHOLDS["optimizer_share"] or vectorised or ops_per_step < THRESHOLDS["optimizer_ops_per_step"]:
        return None
    names = ", ".join(sorted(s.optimizer_names)) or "the optimizer"
    name = sorted(s.optimizer_names)[0] if s.optimizer_names else "AdamW"
    opt = ctx.user.optimizer
    switch = ("The optimizer reads the switch from its parameter groups at each step, so it can be set on the one "
              "you have (its state and hyperparameters stay)")
    if on_cpu and name in FUSED_ON_CPU:
        fix = (f"Use the fused implementation: one pass over all parameters instead of a Python loop of "
               f"per-parameter ops. On the CPU the multi-tensor (foreach) one still loops over the tensors and gains "
               f"little. {switch}; or build it with fused=True.")
        snippet = f"for group in {opt}.param_groups:\n    group['fused'] = True\n    group['foreach'] = False"
    elif on_cpu:
        if s.optimizer_foreach:
            return None  # foreach already, and no fused CPU kernel for it: nothing faster to offer
        fix = (f"Use the multi-tensor (foreach) implementation. On the CPU its ops still loop over the tensors, so "
               f"it gains little: {name} has no fused CPU kernel (Adam, AdamW, SGD and Adagrad have). {switch}.")
        snippet = f"for group in {opt}.param_groups:\n    group['foreach'] = True"
    else:
        fix = (f"Use the multi-tensor (foreach) or fused implementation: one kernel over all parameters instead of "
               f"a Python loop of per-parameter ops. {switch}; or build it with foreach=True, or fused=True where "
               f"{name} supports it.")
        snippet = f"for group in {opt}.param_groups:\n    group['foreach'] = True"
    return make_finding(
        "optimizer", ctx, share,
        f"{names} takes {share:.0%} of the step, one small op per parameter "
        f"({fmt_per_step(ops_per_step)} ops per step)",
        {"optimizer_ms_per_step": round(s.optimizer_us / s.steps / 1e3, 3), "share_of_step": round(share, 4),
         "ops_per_step": round(ops_per_step, 1)},
        Advice(fix, snippet, Expectation.removing(share, f"the optimizer's time (the {'fused' if on_cpu else 'new'} "
                                                         "update still updates)")),
    )
