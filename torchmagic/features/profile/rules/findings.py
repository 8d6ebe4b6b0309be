"""What every rule shares: the thresholds it judges by, and the finding it builds (its severity, its fix
and the command that verifies it)."""

from __future__ import annotations

from dataclasses import dataclass

from ....core.expectations import Expectation
from ..result import Finding, Severity
from ..summary import TraceSummary
from .context import RuleContext

THRESHOLDS = {
    # dataloader: exposed DataLoader __next__ time, as a share of the step (TensorBoard plugin's 5%)
    "dataloader_share": 0.05,
    # sync: host reads of device values per step worth batching; blocking share that is always worth it
    "sync_calls_per_step": 3,
    "sync_block_share": 0.05,
    # dispatch_bound: many ops straight from Python, each short
    "dispatch_ops_per_step": 100,
    "dispatch_median_op_us": 20.0,
    "dispatch_small_op_share": 0.3,   # share of the step spent in those short ops plus Python between them
    # amp: share of op time in fp32 matmul/conv on hardware with fast 16-bit floats
    "amp_fp32_matmul_share": 0.25,
    # ... and only when the matmuls are not tiny: below this mean time per fp32 matmul call (its kernels'
    # time on a GPU, where the host only launches them; its host time on CPU), the casts autocast adds
    # cost more than 16-bit kernels save (an 8x32 @ 32x32 matmul ran 15x slower in bf16 on CPU)
    "amp_min_matmul_us": 20.0,
    "amp_min_speedup": 1.05,        # the amp finding is raised where even the pessimistic prediction beats this
    # copies: copy/conversion share of the step
    "copies_share": 0.10,
    "pageable_h2d_per_step": 1,
    "pageable_h2d_share": 0.05,   # ... and only where those copies take this share of the step on the GPU
    # inference_grad: autograd graph nodes built per step with no backward (grad mode with nothing
    # requiring grad records ops under one sequence number: that counts as one, not a graph)
    "inference_grad_nodes_per_step": 2,
    # ... and, beside a backward, at least this share of the nodes it used: a forward pass, not a stray op
    "inference_grad_unused_share": 0.25,
    # ... and there, that the ops which made those nodes take at least this share of the step: an evaluation
    # pass, not the few nodes a training step leaves unused (an LSTM's final states: 2 a step, 0% of it)
    "inference_grad_eval_share": 0.02,
    # optimizer: optimizer share of the step without foreach/fused kernels
    "optimizer_share": 0.10,
    "optimizer_ops_per_step": 8,
    # gpu_idle: share of the step the device sits idle
    "gpu_idle_share": 0.30,
    # batch_size: memory pressure (allocator retries, or the step's peak allocation this close to the
    # device's size: allocated, not reserved, so below 1 by the allocator's cache and the CUDA context),
    # or a small batch: the device mostly idle with most of its memory unused
    "batch_pressure_peak_fraction": 0.90,
    "batch_small_idle_share": 0.50,
    "batch_small_peak_fraction": 0.25,
    # tensor_core_alignment: 16-bit matmuls with a dimension not a multiple of 8, as a share of all kernel time
    "misaligned_matmul_share": 0.10,
    # kernel statistics: a kernel this short is mostly launch overhead
    "short_kernel_us": 10.0,
    # severity from the share of the step a finding could win back
    "severity_high": 0.25,
    "severity_medium": 0.10,
}

# The torchmagic command that measures each rule's fix; {loader} is the code's DataLoader as it names
# it ("loader" where it names none), {step} a step function for %autobatch, {profile} the name the profile
# is stored under (-o NAME; without one, --verify alone takes the session's last profile).  A cell magic's
# command goes on top of the cell: the profiled one, or for --verify the one with the fix, which it times
# against the profiled cell in interleaved rounds.
VERIFY_NAMES = {"loader": "loader", "step": "step", "profile": ""}
EXPECTING_MAGICS = frozenset({"amp_compare", "loadertune", "torchprofile"})  # verify magics judging --expect
VERIFY = {
    "dataloader": "%loadertune {loader}",
    "batch_size": "%autobatch --throughput {step}",
    "amp": "%%amp_compare --variants eager,amp",
    "dispatch_bound": "%%amp_compare --variants eager,compile",
    "inference_grad": "%%amp_compare --variants eager,inference_mode",
    "sync": "%%torchprofile --warmup 1 --steps 5 --verify {profile}",
    "copies": "%%torchprofile --warmup 1 --steps 5 --verify {profile}",
    "optimizer": "%%torchprofile --warmup 1 --steps 5 --verify {profile}",
    "gpu_idle": "%%torchprofile --warmup 1 --steps 5 --verify {profile}",
    "tensor_core_alignment": "%%torchprofile --warmup 1 --steps 5 --verify {profile}",
}


def severity(share: float) -> Severity:
    """The severity of a finding whose fix could win back ``share`` of the step."""
    if share >= THRESHOLDS["severity_high"]:
        return Severity.HIGH
    if share >= THRESHOLDS["severity_medium"]:
        return Severity.MEDIUM
    return Severity.LOW


@dataclass(frozen=True)
class Advice:
    """What a finding tells the user to do: the fix in words, its code, and the step's predicted speedup."""

    fix: str
    snippet: str
    expected: Expectation | None = None


def make_finding(rule: str, ctx: RuleContext, share: float, title: str, evidence: dict, advice: Advice) -> Finding:
    """The rule's finding, its severity from ``share`` and the command that verifies its fix (``VERIFY``)."""
    command = VERIFY.get(rule)
    magic = command.lstrip("%").split()[0] if command else None
    names = {**VERIFY_NAMES, "loader": ctx.user.loader, "profile": ctx.user.profile or ""}
    verify = " ".join(command.format(**names).split()) if command else None  # an empty name leaves no gap
    expected = advice.expected
    if verify is not None and expected is not None and magic in EXPECTING_MAGICS:
        verify += f" {expected.option()}"
    return Finding(rule=rule, severity=severity(share), title=title, evidence=evidence, fix=advice.fix,
                   snippet=advice.snippet, verify=verify, share=round(share, 4), expected=expected)


def fmt_per_step(count: float) -> str:
    """A count per step as it is: 4, or 3.5 where the steps differ (whole from 100 on: 1922)."""
    return f"{count:.0f}" if count >= 100 else f"{count:.1f}".removesuffix(".0")


def share_of_step(part_us: float, s: TraceSummary) -> float:
    """A share of the steady state: the steps' time less one-time costs (the CUDA context ...)."""
    steady = s.steady_step_us
    return part_us / steady if steady > 0 else 0.0
