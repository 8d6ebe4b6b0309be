"""``--flops``: an op's FLOPs from the shapes and arguments the trace records, by the formulas of
``torch.utils.flop_counter`` (``FlopCounterMode``'s), so the two agree on forward and backward alike.

torch's own profiler count (``with_flops``) knows only a few forward ops (conv2d, mm, addmm, bmm, mul,
add): a CNN's backward convolutions, two thirds of its training FLOPs, count nothing there.
``FlopCounterMode`` counts an op it has a formula for and breaks any other into the ops it is made of;
in a trace every level of that breakdown is an event (aten::conv2d > aten::convolution >
aten::_convolution > aten::mkldnn_convolution), so the summary counts the outermost op with a formula
and nothing beneath it (traces/summary_flops.py).

FlopCounterMode has no formula for the CPU's fused attention (it counts torch 2.13's GPT-2 attention
as 0 FLOPs on the CPU); the same formula as the GPU's fused attention is added for it, as
``CPU_ATTENTION`` (the tests hand it to FlopCounterMode as its ``custom_mapping``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence

import torch
from torch.utils import flop_counter

# the CPU's fused attention, forward and backward: (query, key, value, ...) and (grad_out, query, key,
# value, ...), the argument order of the fused-attention formulas.  Unwrapped (they take shapes), as
# FlopCounterMode's custom_mapping takes them.
CPU_ATTENTION = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: flop_counter.sdpa_flop.__wrapped__,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: flop_counter.sdpa_backward_flop.__wrapped__,
}


@functools.cache
def formulas() -> dict[str, tuple[Callable, int | None]]:
    """Trace op name ("aten::mm") -> (FlopCounterMode's formula, called with shapes for tensors and
    ``out_val`` for the output's; how many arguments it takes, None for any).  The trace records every
    argument, defaults too, where FlopCounterMode passes what the call passed (addmm's formula takes no
    beta or alpha).  The formulas that read the tensors themselves (the GPU attention kernels beneath a
    fused-attention op, counted at that op) are left out."""
    found = {}
    registered = {packet: formula for packet, formula in flop_counter.flop_registry.items()
                  if hasattr(formula, "__wrapped__")}  # shape_wrapper's: takes shapes
    registered.update({packet: flop_counter.shape_wrapper(formula) for packet, formula in CPU_ATTENTION.items()
                       if packet not in registered})
    for packet, formula in registered.items():
        name = getattr(packet, "_qualified_op_name", None)
        if name is not None:
            found[name] = (formula, _positional(formula.__wrapped__))
    return found


def _positional(formula: Callable) -> int | None:
    params = inspect.signature(formula).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "out_shape" for p in params)


def counts_flops(name: str) -> bool:
    return name in formulas()


def op_flops(name: str, shapes: Sequence, concrete: Sequence) -> int:
    """FLOPs of one call of ``name`` from the trace's input shapes and concrete (non-tensor) arguments;
    0 where the arguments do not fit the formula (an overload the trace cannot tell apart)."""
    found = formulas().get(name)
    if found is None:
        return 0
    formula, takes = found
    args = [value if value is not None else _shape(shape) for shape, value in zip(shapes, concrete)]
    args += [_shape(shape) for shape in shapes[len(concrete):]]
    args = args[:takes]
    try:
        out_shape = (_conv_output_shape(args) if name in _CONVOLUTIONS
                     else (args[1], args[2], None) if name == "aten::convolution_backward"  # grad of input, weight
                     else None)
        return int(formula(*args, out_val=out_shape))
    except Exception:  # noqa: BLE001 - a formula reading an argument the trace records differently
        return 0


_CONVOLUTIONS = frozenset({"aten::convolution", "aten::_convolution", "aten::cudnn_convolution",
                           "aten::_slow_conv2d_forward", "aten::convolution_overrideable"})


def _shape(shape) -> torch.Size | None:
    return torch.Size(shape) if isinstance(shape, list) and all(isinstance(d, int) for d in shape) else None


def _conv_output_shape(args: list) -> torch.Size:
    """A convolution's output shape (its formula needs it; the trace records inputs only), from
    (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)."""
    x, w = args[0], args[1]
    stride, padding, dilation = args[3], args[4], args[5]
    transposed = len(args) > 6 and bool(args[6])
    output_padding = args[7] if len(args) > 7 and isinstance(args[7], list) else [0] * (len(x) - 2)
    groups = args[8] if len(args) > 8 and isinstance(args[8], int) else 1
    spatial = []
    for i, size in enumerate(x[2:]):
        k, s, p, d = w[2 + i], _at(stride, i), _at(padding, i), _at(dilation, i)
        if transposed:
            spatial.append((size - 1) * s - 2 * p + d * (k - 1) + _at(output_padding, i) + 1)
        else:
            spatial.append((size + 2 * p - d * (k - 1) - 1) // s + 1)
    channels = w[1] * groups if transposed else w[0]
    return torch.Size([x[0], channels, *spatial])


def _at(values, i: int) -> int:
    if isinstance(values, int):
        return values
    return values[i] if len(values) > i else values[0]
