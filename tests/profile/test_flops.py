"""--flops counts what torch.utils.flop_counter.FlopCounterMode counts, forward and backward: a CNN's
backward convolutions (two thirds of its training FLOPs, which torch's profiler count misses), grouped,
strided, dilated and transposed convolutions, matmuls with their bias, and the CPU's fused attention."""

import json

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.features.profile.flops import CPU_ATTENTION, op_flops
from torchmagic.features.profile.traces.fields import literal


class _Attention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm, self.mlp = nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return (x + self.mlp(x)).mean(1)


def _cnn():
    return nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=2, dilation=2, groups=4), nn.ReLU(),
        nn.Conv2d(32, 32, 3, groups=32, padding=1),  # depthwise
        nn.ConvTranspose2d(32, 8, 4, stride=2, padding=1, output_padding=0),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


CASES = {
    "cnn": (_cnn, lambda: torch.randn(4, 3, 32, 32)),
    "conv1d": (lambda: nn.Sequential(nn.Conv1d(8, 16, 7, stride=3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4)),
               lambda: torch.randn(2, 8, 100)),
    "mlp": (lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)), lambda: torch.randn(32, 64)),
    "attention": (_Attention, lambda: torch.randn(2, 32, 64)),
}


def _reference(step):
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        step()
    return counter.get_total_flops(), {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_training_steps_flops_are_flop_counter_modes_forward_and_backward(case):
    torch.manual_seed(0)
    make, data = CASES[case]
    model, x = make(), data()
    model(x)  # lazy modules take their shapes
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    expected, by_op = _reference(step)
    r = torchmagic.profile(step, flops=True, steps=2, device=CpuDevice())
    counted = sum(op.flops for op in r.ops) / 2
    assert counted == pytest.approx(expected, rel=1e-6), (by_op, {op.name: op.flops / 2 for op in r.ops if op.flops})
    if case == "cnn":
        assert by_op["aten.convolution_backward"] > by_op["aten.convolution"]  # the FLOPs torch's count missed
        names = {row.name for row in r.roofline}
        assert {"aten::convolution", "aten::convolution_backward"} <= names  # the convolutions reach the roofline
        assert 0 < r.mfu < 2
    if case == "attention":
        assert by_op["aten._scaled_dot_product_flash_attention_for_cpu_backward"] > 0


def test_flop_counter_modes_own_count_of_the_cpus_fused_attention_agrees_with_ours():
    """Up to torch 2.14 FlopCounterMode counted the CPU's fused attention as 0 (CPU_ATTENTION adds its formula);
    from 2.15 it counts it itself, with the same figure."""
    from torch.utils import flop_counter

    from torchmagic.features.profile.flops import CPU_ATTENTION

    torch.manual_seed(0)
    model, x = _Attention(), torch.randn(2, 32, 64)
    with FlopCounterMode(display=False) as plain:
        model(x).sum().backward()
    with_attention, by_op = _reference(lambda: model(x).sum().backward())
    attention = sum(v for k, v in by_op.items() if "attention" in k)
    counted_by_torch = all(op in flop_counter.flop_registry for op in CPU_ATTENTION)
    assert attention > 0
    assert plain.get_total_flops() == (with_attention if counted_by_torch else with_attention - attention)


def test_an_ops_flops_are_read_from_its_shapes_and_concrete_arguments():
    conv = op_flops("aten::convolution", [[2, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], [], [], []],
                    [None, None, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1])
    assert conv == 2 * 2 * 8 * 8 * 8 * 3 * 3 * 3  # 2 x batch x output pixels x C_out x C_in x kernel
    # backward: grad input (not wanted for the network's first layer) and grad weight, by output_mask
    args = [None, None, None, [8], [1, 1], [0, 0], [1, 1], False, [0, 0], 1]
    shapes = [[2, 8, 6, 6], [2, 3, 8, 8], [8, 3, 3, 3]] + [[]] * 8
    both = op_flops("aten::convolution_backward", shapes, args + [[True, True, True]])
    weight_only = op_flops("aten::convolution_backward", shapes, args + [[False, True, True]])
    assert both == 2 * weight_only == 2 * conv_flops_of(2, 6 * 6, 8, 3 * 9)
    # addmm as the trace records it (beta and alpha too), which FlopCounterMode's formula does not take
    assert op_flops("aten::addmm", [[16], [64, 32], [32, 16], [], []], [None, None, None, 1, 1]) == 2 * 64 * 32 * 16
    assert op_flops("aten::relu", [[4, 4]], [None]) == 0
    assert op_flops("aten::convolution", [[2, 3, 16, 16]], [None]) == 0  # arguments missing: 0, no exception


def conv_flops_of(batch, pixels, c_out, c_in_kernel):
    return 2 * batch * pixels * c_out * c_in_kernel


def test_a_saved_traces_concrete_inputs_are_read_as_values(tmp_path):
    """A file profiled with_flops: its convolution's non-tensor inputs, written as text, are read as the values
    the formula takes."""
    from .traces.synthetic import event, write_trace

    args = {"Input Dims": [[2, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], [], [], []],
            "Input type": ["float"] * 3 + [""] * 6,
            "Concrete Inputs": ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]}
    assert [literal(v) for v in args["Concrete Inputs"]] == [None, None, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1]
    path = write_trace(tmp_path / "conv.json", [event("ProfilerStep#1", 0, 10, cat="user_annotation"),
                                                event("aten::convolution", 1, 2, **args)])
    data = json.loads(path.read_text())
    path.write_text(json.dumps(data | {"with_flops": 1}))
    conv = {op.name: op for op in torchmagic.analyze(str(path)).profile.ops}["aten::convolution"]
    assert conv.flops == 2 * 2 * 8 * 8 * 8 * 27


def test_on_a_gpu_a_convolutions_flops_meet_the_kernels_its_children_launched():
    from .kineto_fakes import summarized
    from .test_gpu_trace import CUDA, Ev, step

    class _Conv(Ev):
        def shapes(self): return [[2, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], [], [], []]
        def concrete_inputs(self): return [None, None, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1]

    events = step(_Conv("aten::convolution", 100, 400, corr=1),
                  Ev("aten::_convolution", 110, 390, corr=2),
                  Ev("aten::cudnn_convolution", 120, 380, corr=3),
                  Ev("cudaLaunchKernel", 130, 140, tid=99_001, linked=3),
                  Ev("implicit_gemm_kernel", 500, 750, device=CUDA, linked=3))
    s = summarized(events, flops=True)
    conv = s.ops["aten::convolution"]
    assert conv.flops == 2 * 2 * 8 * 8 * 8 * 27 and conv.flop_device_us == 250
    assert s.ops["aten::_convolution"].flops == 0 and s.ops["aten::cudnn_convolution"].self_device_us == 250
