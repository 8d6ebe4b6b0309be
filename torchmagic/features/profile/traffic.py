"""What an operator's tensors weigh, from the shapes and dtypes the trace records: the bytes a roofline
divides its FLOPs by, a pointwise op's FLOPs (torch counts matmuls and convolutions only), and a
matmul's M x K x N (tensor cores want multiples of 8)."""

from __future__ import annotations

import math

# GEMMs: the last two inputs are the [..., M, K] and [..., K, N] operands
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm",
                      "aten::_addmm_activation", "aten::_mm"})
# convolutions: the last input of 3 dimensions or more is the weight, [C_out, C_in / groups, *kernel]
CONV_OPS = frozenset({"aten::mkldnn_convolution", "aten::cudnn_convolution", "aten::_slow_conv2d_forward",
                      "aten::convolution_backward", "aten::cudnn_convolution_transpose",
                      "aten::miopen_convolution"})
MATMUL_OPS = GEMM_OPS | CONV_OPS | frozenset({
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_cudnn_attention",
    "aten::mkldnn_rnn_layer", "aten::_thnn_fused_lstm_cell", "aten::linear_backward",
})


ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
                 "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1,
                 "c10::Float8_e5m2": 1, "c10::complex<float>": 8, "c10::complex<double>": 16}
POINTWISE_OPS = frozenset({
    "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
    "aten::relu", "aten::relu_", "aten::clamp_min", "aten::clamp_min_", "aten::threshold_backward", "aten::gelu",
    "aten::gelu_backward", "aten::silu", "aten::sigmoid", "aten::tanh", "aten::exp", "aten::neg", "aten::pow",
    "aten::sqrt", "aten::rsqrt", "aten::where", "aten::addcmul_", "aten::addcdiv_", "aten::lerp_", "aten::abs",
})


def tensor_traffic(name: str, shapes, dtypes) -> tuple[int, str | None, int]:
    """(bytes an op's tensors hold: inputs plus its output, its first input's dtype, estimated FLOPs for a
    pointwise op).  The output is the matmul's [..., M, N] for a matmul, the largest input for a
    pointwise op, and not counted otherwise (its size is not in the trace)."""
    sizes, dims = [], []
    for shape, dtype in zip(shapes, dtypes):
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape) and dtype in ELEMENT_BYTES:
            numel = math.prod(shape)
            sizes.append((numel, ELEMENT_BYTES[dtype]))
            dims.append(shape)
    if not sizes:
        return 0, None, 0
    moved = sum(n * b for n, b in sizes)
    first = next((d for d in dtypes if d in ELEMENT_BYTES), None)
    element = ELEMENT_BYTES.get(first, 4)
    if name in GEMM_OPS and len(dims) >= 2 and len(dims[-1]) >= 2 and len(dims[-2]) >= 2:
        a, b = dims[-2], dims[-1]
        moved += math.prod(a[:-1]) * b[-1] * element
        return moved, first, 0
    if name in POINTWISE_OPS:
        largest = max(n for n, _ in sizes)
        return moved + largest * element, first, largest
    return moved, first, 0


TENSOR_CORE_MULTIPLE = 8  # fp16/bf16 GEMM dimensions (and convolution channels) tensor cores take at full rate


def matmul_dims(shapes) -> tuple[int, int, int] | None:
    """(M, K, N) of a matmul from its inputs' shapes: the last two inputs of two dimensions or more."""
    mats = [s for s in shapes if isinstance(s, list) and len(s) >= 2 and all(isinstance(d, int) for d in s)]
    if len(mats) < 2:
        return None
    a, b = mats[-2], mats[-1]
    return a[-2], a[-1], b[-1]


def off_tensor_core_grain(name: str, shapes) -> str | None:
    """The shape of a 16-bit GEMM or convolution that tensor cores cannot take at full rate, as the
    report names it ("4096x768x50257": M x K x N; "conv 3→64": a convolution's input → output channels,
    its implicit GEMM's K and N), or None where it is on the grain, or not a GEMM or convolution."""
    if name in GEMM_OPS:
        dims = matmul_dims(shapes)
        if dims and any(d % TENSOR_CORE_MULTIPLE for d in dims):
            return "x".join(map(str, dims))
    elif name in CONV_OPS:
        weights = [s for s in shapes if isinstance(s, list) and len(s) >= 3 and all(isinstance(d, int) for d in s)]
        if weights:
            c_out, c_in = weights[-1][0], weights[-1][1]
            if c_out % TENSOR_CORE_MULTIPLE or c_in % TENSOR_CORE_MULTIPLE:
                return f"conv {c_in}→{c_out}"
    return None
