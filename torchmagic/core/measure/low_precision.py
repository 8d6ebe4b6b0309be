"""What 16-bit autocast would do to a step's own matmuls and convolutions on this device, measured.

Whether bf16 is faster is not a property of the CPU's flags: an AMX Xeon runs a large GEMM in bf16 2-3x
faster, a small or skinny one no faster once its inputs are converted, and an AVX2-only EPYC runs bf16
10-20x slower.  So each heavy call is re-run as the trace recorded it (the same aten op, its shapes and
its arguments, on random data) in fp32, then with its inputs converted to 16 bits inside the timed call,
as autocast converts them.  A backend's own convolution (mkldnn's) is re-run through aten::convolution,
which picks the backend for the dtype as autocast's conv2d does: mkldnn refuses bf16 on a CPU without
AVX512BW/VL/DQ or AVX-NE-CONVERT, where a bf16 convolution runs the slow reference kernel (a 64-channel
3x3 at 56x56 took 25x its fp32 time on the AVX2 EPYC).  The ops that follow a 16-bit matmul run in 16
bits too under autocast (pointwise ops, norms on the CPU): one pointwise op is timed both ways at the step's
activation size.

The user's random state is untouched (a private generator makes the data), and nothing is kept.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..devices import Device, is_out_of_memory
from .timing import timed_block

ELEMENT_DTYPES = {"float": torch.float32}   # the trace's names of the inputs this converts
MIN_BLOCK_S = 0.004                        # calls per timing until a block takes this long
REPEATS = 3                                # best of: the op's time, not the machine's noise
MAX_ELEMENTS = 1 << 26                     # a call whose tensors hold more is not re-run (256 MiB in fp32)


@dataclass(frozen=True)
class OpCall:
    """One distinct call of an op, as the trace recorded it."""

    name: str           # "aten::mm"
    shapes: tuple       # per input: its shape (a tuple), or () for a non-tensor
    dtypes: tuple       # per input: the trace's type name ("float", "Scalar", "")
    concrete: tuple     # per input: its value where it is not a tensor, else None


def freeze(value):
    """A trace's nested lists as tuples (hashable)."""
    return tuple(freeze(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class Retimed:
    """A call's time in 16 bits and its inputs' conversion alone, each over its time in fp32."""

    ratio: float        # the call in 16 bits, its inputs converted within it (as autocast converts them)
    conversion: float   # converting its inputs alone: in training, their gradients come back converted too


def call_ratios(device: Device, calls: list[OpCall], dtype: torch.dtype, budget_s: float) -> dict[OpCall, Retimed]:
    """Each call re-timed in ``dtype`` against fp32, heaviest first, as many as ``budget_s`` allows.  A call
    that cannot be rebuilt or does not fit is left out."""
    ratios: dict[OpCall, Retimed] = {}
    generator = torch.Generator(device=device.label).manual_seed(0)
    started = time.perf_counter()
    for call in calls:
        key = (device.label, torch.get_num_threads(), dtype, call)
        if key in _measured:
            ratios[call] = _measured[key]
            continue
        if time.perf_counter() - started > budget_s:
            continue  # those measured before may still be known
        try:
            fp32, low, convert = _rebuild(call, device, dtype, generator)
            if fp32 is None:
                continue
            base = _time(fp32, device)
            ratios[call] = _measured[key] = Retimed(_time(low, device) / base, _time(convert, device) / base)
        except Exception as exc:  # noqa: BLE001 - an argument the trace records differently: skip the call
            if is_out_of_memory(exc):
                break
    return ratios


_measured: dict[tuple, Retimed | float] = {}  # (device, threads, dtype, call or size) -> ratios, for the process


def pointwise_ratio(device: Device, dtype: torch.dtype, numel: int) -> float:
    """Time of a pointwise op (x * y + x, GELU's kind of work) in ``dtype`` over fp32, at ``numel``."""
    numel = max(min(numel, MAX_ELEMENTS // 4), 1024)
    key = (device.label, torch.get_num_threads(), dtype, "pointwise", numel)
    if key not in _measured:
        generator = torch.Generator(device=device.label).manual_seed(0)
        x, y = (torch.rand(numel, generator=generator, device=device.label) for _ in range(2))
        lx, ly = x.to(dtype), y.to(dtype)
        _measured[key] = _time(lambda: torch.addcmul(ly, lx, ly), device) / _time(lambda: torch.addcmul(y, x, y), device)
    return _measured[key]


def autocast_op_cost_us(device: Device, dtype: torch.dtype) -> float:
    """What autocast adds to an op it sees that it leaves in fp32 (its dispatch), in µs: a tiny op timed
    with and without autocast on, once a process (40-60 ms: most of a small profile's analysis)."""
    key = (device.label, torch.get_num_threads(), dtype, "autocast op")
    if key not in _measured:
        _measured[key] = _autocast_op_cost_us(device, dtype)
    return _measured[key]


def _autocast_op_cost_us(device: Device, dtype: torch.dtype) -> float:
    x = torch.zeros(8, device=device.label)

    def under_autocast():
        with torch.autocast(device.kind, dtype=dtype):
            for _ in range(100):
                torch.add(x, x)

    def plain():
        for _ in range(100):
            torch.add(x, x)

    return max(_time(under_autocast, device) - _time(plain, device), 0.0) / 100 * 1e6


def _rebuild(call: OpCall, device: Device, dtype: torch.dtype, generator):
    """(fp32 call, low-precision call, the conversion alone) of ``call``'s aten op on random inputs of its
    shapes."""
    namespace, _, op_name = call.name.partition("::")
    op = getattr(getattr(torch.ops, namespace, None), op_name, None)
    if op is None:
        return None, None, None
    args, tensors = [], []
    for shape, kind, value in zip(call.shapes, call.dtypes, call.concrete):
        if value is not None:
            args.append(list(value) if isinstance(value, tuple) else value)
        elif kind in ELEMENT_DTYPES:
            if math.prod(shape) > MAX_ELEMENTS:
                return None, None, None
            tensors.append(len(args))
            args.append(torch.rand(shape, generator=generator, device=device.label) - 0.5)
        else:
            args.append(None)  # an optional tensor the call did not pass
    if not tensors:
        return None, None, None
    if call.name in _THROUGH_CONVOLUTION:
        op, args, tensors = torch.ops.aten.convolution, *_THROUGH_CONVOLUTION[call.name](args, tensors)
    # the trace lists keyword-only arguments (addmm's beta and alpha) in order with the others
    overload = getattr(op, "default", None)
    schema = overload._schema.arguments if overload is not None else ()
    keywords = {i: a.name for i, a in enumerate(schema) if a.kwarg_only and i < len(args)}

    def run(values):
        return op(*(v for i, v in enumerate(values) if i not in keywords),
                  **{name: values[i] for i, name in keywords.items()})

    def low():
        converted = list(args)
        for i in tensors:
            converted[i] = args[i].to(dtype)
        return run(converted)

    def convert():
        for i in tensors:
            args[i].to(dtype)

    run(args)  # warm: kernels chosen, pages touched; raises here if the call cannot be rebuilt
    low()
    return (lambda: run(args)), low, convert


def _from_mkldnn(args: list, tensors: list[int]) -> tuple[list, list[int]]:
    """mkldnn_convolution's (input, weight, bias, padding, stride, dilation, groups) as aten::convolution's
    (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups); the tensors stay
    first."""
    data, weight, bias, padding, stride, dilation, groups = args
    return [data, weight, bias, stride, padding, dilation, False, [0] * len(padding), groups], tensors


# backend convolutions re-timed through aten::convolution: (the recorded arguments, the tensors' places) -> its own
_THROUGH_CONVOLUTION = {"aten::mkldnn_convolution": _from_mkldnn}


def _time(fn, device: Device) -> float:
    """Seconds per call: the best of REPEATS blocks, each of enough calls to take MIN_BLOCK_S."""
    calls = 1
    while timed_block(fn, calls, device) < MIN_BLOCK_S and calls < 1 << 12:
        calls *= 2
    return min(timed_block(fn, calls, device) for _ in range(REPEATS)) / calls
