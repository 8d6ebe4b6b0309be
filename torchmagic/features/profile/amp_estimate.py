"""The amp finding's prediction: what bf16/fp16 autocast would do to this step on this device.

Measured, not assumed (core/measure/low_precision.py): the step's own fp32 matmuls and convolutions,
re-run at their shapes in 16 bits with the conversions autocast adds; the pointwise ops that would follow
them in 16 bits; and the cost autocast adds to every op it sees.  The step's time is then predicted as a
range, from what the trace says each part took:

    after = rest + Σ matmul time × its measured ratio (+ its inputs' conversion again, for a forward call in
            training: the worst case) + other forward/backward time × (1 .. pointwise ratios)
            + ops per step × autocast's cost per op

The range is as wide as what is not known: whether the gradients' conversions back cost what the
inputs' did, calls not re-timed (the budget ran out: the timed calls' best and worst), and the other ops
anywhere between unchanged and a pointwise op's 16-bit ratios at the smallest and largest of the step's
tensor sizes (16 bits is faster on large tensors and slower on small ones).
On a GPU only the time the GPU is busy can shrink: the host-bound part of the step stays.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ...core.devices import Device
from ...core.expectations import Expectation
from ...core.measure.low_precision import autocast_op_cost_us, call_ratios, pointwise_ratio
from .categories import BACKWARD, FORWARD
from .summary import TraceSummary

BUDGET_S = 0.6          # re-timing the step's calls: at most this long, heaviest first
COVERED_SHARE = 0.95    # re-time calls until they cover this share of the fp32 matmul time
MIN_SHARE = 0.05        # no estimate for a step whose fp32 matmuls take less than this
POINTWISE_MIN_ELEMENTS = 4096


@dataclass(frozen=True)
class AmpEstimate:
    expectation: Expectation        # the step's predicted speedup under autocast, with its basis
    matmul_share: float             # of the step: the fp32 matmuls and convolutions
    matmul_ratio: float             # their time in 16 bits over fp32, as measured (time-weighted)
    pointwise_ratio: float          # the worst of a pointwise op's 16-bit ratios at the step's sizes
    calls_timed: int
    calls: int
    seconds: float                  # what measuring took


def estimate_amp(s: TraceSummary, device: Device, dtype: torch.dtype) -> AmpEstimate | None:
    if not s.steps or not s.fp32_matmuls:
        return None
    started = time.perf_counter()
    on_device = s.has_device_events
    column = 2 if on_device else 1
    step_us = s.steady_step_us / s.steps
    matmul = {call: t[column] / s.steps for call, t in s.fp32_matmuls.items() if t[column] > 0}
    total = sum(matmul.values())
    if not step_us or total < MIN_SHARE * step_us:
        return None
    heaviest, covered = [], 0.0
    for call in sorted(matmul, key=matmul.get, reverse=True):
        if covered >= COVERED_SHARE * total:
            break
        heaviest.append(call)
        covered += matmul[call]
    retimed = call_ratios(device, heaviest, dtype, BUDGET_S)
    if not retimed:
        return None
    # in training each converted input's gradient is converted back: the worst case pays that again
    forward = {c: s.fp32_matmuls[c][3] / s.fp32_matmuls[c][0] for c in retimed}
    best = {c: r.ratio for c, r in retimed.items()}
    worst = {c: r.ratio + forward[c] * r.conversion for c, r in retimed.items()}
    timed = sum(matmul[c] for c in retimed)
    timed_after = sum(matmul[c] * best[c] for c in retimed)
    untimed = total - timed  # calls the budget left: the timed ones' best and worst
    after_best = timed_after + untimed * min(best.values())
    after_worst = sum(matmul[c] * worst[c] for c in retimed) + untimed * max(worst.values())
    categories = s.device_category_us if on_device else s.category_us
    low_us = s.matmul_low_device_us if on_device else s.matmul_low_us
    others = max(categories.get(FORWARD, 0.0) + categories.get(BACKWARD, 0.0) - total * s.steps
                 - low_us, 0.0) / s.steps
    # pointwise ops in 16 bits: faster on large tensors, slower on small ones (an AMX Xeon: 0.7x at 1.5M
    # elements, 1.9x at 130k): timed at the smallest and the largest tensor the step's matmuls take
    sizes = [n for call in retimed for n in map(_numel, call.shapes) if n >= POINTWISE_MIN_ELEMENTS]
    pointwise = [pointwise_ratio(device, dtype, n) for n in {min(sizes, default=POINTWISE_MIN_ELEMENTS),
                                                             max(sizes, default=POINTWISE_MIN_ELEMENTS)}]
    per_op = autocast_op_cost_us(device, dtype) * s.python_ops / s.steps
    saved_best = total - after_best + others * (1 - min(*pointwise, 1.0)) - per_op
    saved_worst = total - after_worst + others * (1 - max(*pointwise, 1.0)) - per_op
    if on_device:  # kernels saved shorten a step only as far as the GPU is what it waits for
        busy = min(s.device_busy_us / s.steps / step_us, 1.0) if step_us else 1.0
        saved_worst = saved_worst * busy if saved_worst > 0 else saved_worst
    high, low = step_us / max(step_us - saved_best, 1e-9), step_us / max(step_us - saved_worst, 1e-9)
    ratio = timed_after / timed
    basis = (f"the {total / step_us:.0%} of the step in fp32 matmul/conv ran {_speed(ratio)} in "
             f"{str(dtype).removeprefix('torch.')} when re-timed here at the step's shapes ({len(retimed)} of "
             f"{len(matmul)} calls, conversions included, and at worst their gradients' conversions back too); the "
             f"other forward and backward ops ({others / step_us:.0%}) from {_speed(min(*pointwise, 1.0))} to "
             f"{_speed(max(*pointwise, 1.0))} (a pointwise op timed at the step's sizes); "
             f"autocast's cost on {s.python_ops / s.steps:.0f} ops a step")
    return AmpEstimate(Expectation(round(min(low, high), 2), round(max(low, high), 2), basis), total / step_us,
                       ratio, max(pointwise), len(retimed), len(matmul), time.perf_counter() - started)


def _speed(ratio: float) -> str:
    """A time ratio (16-bit over fp32) as a speed: "2.1x faster", "1.4x slower", "unchanged"."""
    if ratio == 1.0:
        return "unchanged"
    return f"{1 / ratio:.2g}x faster" if ratio < 1 else f"{ratio:.2g}x slower"


def _numel(shape) -> int:
    """A tensor input's elements; 0 for a non-tensor argument (an empty shape)."""
    return math.prod(shape) if shape and all(isinstance(d, int) for d in shape) else 0
