"""Precision: fp32 matmuls and convolutions on hardware with fast 16-bit types (autocast, and what it is
predicted or measured to bring), and 16-bit ones off the tensor cores' grain."""

from __future__ import annotations

from ....core.expectations import Expectation, measured
from ..result import Finding
from ..summary import TraceSummary, largest
from ..traffic import TENSOR_CORE_MULTIPLE
from .context import RuleContext
from .findings import THRESHOLDS, Advice, make_finding, share_of_step


def amp(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    if not ctx.low_precision_fast:
        return None  # no 16-bit matmul instructions (an AVX2-only CPU, a pre-Volta GPU): never faster
    if ctx.traces_kernels and not s.has_device_events:
        return None  # such an op's host time is its launch: without kernel times there is nothing to judge
    # on a GPU, by kernel time: share of all kernel time, and time per call (the host only launches)
    on_device = s.has_device_events
    fp32 = s.matmul_fp32_device_us if on_device else s.matmul_fp32_us
    calls = s.matmul_fp32_device_calls if on_device else s.matmul_fp32_calls
    share = fp32_matmul_share(s)
    if share < THRESHOLDS["amp_fp32_matmul_share"]:
        return None
    expected, claim = _amp_expected(ctx)
    if expected is None and (ctx.amp_estimate is not None or measured("amp", ctx.code) is not None):
        return None  # predicted, or measured, to bring too little here
    if expected is None and calls and fp32 / calls < THRESHOLDS["amp_min_matmul_us"]:
        return None
    dtype = ctx.low_precision_dtype or "bfloat16"
    device = ctx.device_type
    model, opt = ctx.user.model, ctx.user.optimizer
    training = s.backward_events > 0
    fp16_training = training and dtype == "float16"
    if fp16_training:
        snippet = (f"scaler = torch.amp.GradScaler('{device}')   # once, before the loop\n"
                   f"with torch.autocast('{device}', dtype=torch.float16):\n    loss = loss_fn({model}(x), y)\n"
                   f"scaler.scale(loss).backward()\nscaler.step({opt})\nscaler.update()")
    elif training:
        snippet = (f"with torch.autocast('{device}', dtype=torch.{dtype}):\n    loss = loss_fn({model}(x), y)\n"
                   "loss.backward()   # outside autocast")
    else:
        snippet = f"with torch.inference_mode(), torch.autocast('{device}', dtype=torch.{dtype}):\n    out = {model}(x)"
    fix = f"Run the forward pass under autocast: matmuls and convolutions in {dtype}; {ctx.autocast_keeps}. "
    if dtype == "bfloat16":
        fix += "bfloat16 keeps fp32's range, so no loss scaling is needed. "
    else:
        fix += (f"fp16 is the fast type here ({ctx.low_precision_reason}): "
                + ("scale the loss with a GradScaler so small fp16 gradients do not flush to zero. "
                   if training else "it suits inference as is. "))
    per_call = fp32 / calls if calls else None
    evidence = {"fp32_matmul_share": round(share, 4), "fp32_matmul_ms": round(fp32 / 1e3, 3),
                "fp32_matmul_us_per_call": round(per_call, 1) if per_call is not None else None,
                "low_precision_matmul_ms": round((s.matmul_low_device_us if on_device else s.matmul_low_us) / 1e3, 3),
                "why": ctx.low_precision_reason}
    if ctx.amp_estimate is not None:
        e = ctx.amp_estimate
        evidence.update(matmul_ratio_measured=round(e.matmul_ratio, 3), pointwise_ratio_measured=round(e.pointwise_ratio, 3),
                        calls_retimed=e.calls_timed, calls=e.calls)
    if expected is not None:
        evidence.update(predicted_speedup=[expected.low, expected.high], predicted_from=expected.basis)
    return make_finding(
        "amp", ctx, share,
        f"{share:.0%} of the {'GPU kernel' if on_device else 'step'} time is fp32 matmul/conv; {claim}",
        evidence,
        Advice(fix + "Check the accuracy of the result against fp32 (%%amp_compare does).", snippet, expected),
    )


def fp32_matmul_share(s: TraceSummary) -> float:
    """The fp32 matmuls' and convolutions' share: of the GPU's kernel time where the trace has kernels, else
    of the steps."""
    fp32 = s.matmul_fp32_device_us if s.has_device_events else s.matmul_fp32_us
    basis = sum(s.device_category_us.values()) if s.has_device_events else s.total_step_us
    return fp32 / basis if basis > 0 else 0.0


def amp_worth_estimating(s: TraceSummary) -> bool:
    return fp32_matmul_share(s) >= THRESHOLDS["amp_fp32_matmul_share"]


def _amp_expected(ctx: RuleContext) -> tuple[Expectation | None, str]:
    """The amp fix's predicted step speedup and the title's claim: from what %%amp_compare measured on this
    code where it has, else re-timed here (amp_estimate.py), else (a trace from elsewhere) the device's
    known capability alone, with no figure.  None where what is known says it would bring too little."""
    dtype = ctx.low_precision_dtype or "bfloat16"
    verdict = measured("amp", ctx.code)
    if verdict is not None:
        low, high = verdict.ci
        if low < THRESHOLDS["amp_min_speedup"]:
            return None, ""
        return (Expectation(round(low, 2), round(high, 2), "%%amp_compare measured it on this code"),
                f"%%amp_compare measured autocast {verdict.speedup:.2f}x on this code")
    e = ctx.amp_estimate
    if e is not None:
        if e.expectation.low < THRESHOLDS["amp_min_speedup"]:
            return None, ""
        return e.expectation, f"{dtype} autocast predicted {e.expectation.text()} faster here"
    return None, f"this device runs {dtype} faster"


def tensor_core_alignment(s: TraceSummary, ctx: RuleContext) -> Finding | None:
    """fp16/bf16 matmuls whose M, K or N is not a multiple of 8, and convolutions whose input or output
    channels are not: cuBLAS and cuDNN cannot run them on tensor cores at full rate (a 50257-token
    vocabulary, or an RGB image's 3 channels, are the classic cases)."""
    kernels = sum(s.kernel_us)
    if not ctx.traces_kernels or kernels <= 0:
        return None
    share = s.misaligned_matmul_device_us / kernels
    if share < THRESHOLDS["misaligned_matmul_share"]:
        return None
    shapes = [shape for shape, _ in largest(s.misaligned_shapes, 3)]
    removed = share_of_step(s.misaligned_matmul_device_us, s)
    fix = (f"Pad the dimensions to multiples of {TENSOR_CORE_MULTIPLE} (64 for a vocabulary): hidden sizes, the "
           "output layer's rows, batch x sequence, a convolution's channels (an RGB input padded to 4 or 8 channels "
           "of zeros, in channels_last). cuBLAS and cuDNN then run them on tensor cores at full rate; the padding "
           "costs little and can be masked or sliced off.")
    snippet = ("def padded(n, multiple=8):\n    return -(-n // multiple) * multiple\n"
               "head = torch.nn.Linear(padded(1000), padded(50257, 64))   # e.g. a language model's output layer")
    return make_finding(
        "tensor_core_alignment", ctx, removed,
        f"{share:.0%} of the kernel time is 16-bit matmuls or convolutions with a dimension off the tensor "
        f"cores' grain ({'; '.join(shapes)}; M x K x N, or a convolution's channels in → out)",
        {"misaligned_share_of_kernels": round(share, 4), "misaligned_ms_per_step":
         round(s.misaligned_matmul_device_us / s.steps / 1e3, 3), "shapes": shapes},
        Advice(fix, snippet, Expectation.removing(removed, "the misaligned matmuls' kernel time")),
    )
