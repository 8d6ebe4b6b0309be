"""--flops: each heavy operator on the roofline of the machine at hand, with the roofs measured here:
a big matmul lands compute-bound, pointwise ops memory-bound."""

import torch

import torchmagic
from torchmagic.core.devices import CpuDevice
from torchmagic.core.measure import peaks
from torchmagic.features.profile.traffic import tensor_traffic


def test_the_bytes_an_op_moves_are_read_from_its_shapes_and_dtypes():
    mm = tensor_traffic("aten::mm", [[64, 32], [32, 16]], ["float", "float"])
    assert mm == ((64 * 32 + 32 * 16 + 64 * 16) * 4, "float", 0)
    addmm = tensor_traffic("aten::addmm", [[16], [64, 32], [32, 16], [], []], ["float"] * 3 + ["Scalar"] * 2)
    assert addmm[0] == (16 + 64 * 32 + 32 * 16 + 64 * 16) * 4
    half = tensor_traffic("aten::add", [[1000], [1000], []], ["c10::Half", "c10::Half", "Scalar"])
    assert half == (3 * 1000 * 2, "c10::Half", 1000)  # two inputs read, the output written; 1 FLOP an element
    assert tensor_traffic("aten::cat", [[[4, 4], [4, 4]], []], ["TensorList", "Scalar"]) == (0, None, 0)


def test_a_matmul_is_compute_bound_and_pointwise_ops_memory_bound_on_the_measured_roofs():
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    x, y = torch.randn(1 << 22), torch.randn(1 << 22)

    def step():
        a @ b
        x + y
        torch.relu(x)

    r = torchmagic.profile(step, flops=True, steps=2, warmup=1, device=CpuDevice())
    rows = {row.name: row for row in r.roofline}
    assert rows["aten::mm"].bound == "compute" and rows["aten::mm"].intensity > 100
    assert rows["aten::add"].bound == "memory" and rows["aten::add"].intensity < 0.1
    assert rows["aten::clamp_min"].bound == "memory" and rows["aten::clamp_min"].estimated  # relu, 1 FLOP an element
    assert all(row.fraction_of_roof > 0 and row.achieved_flops_per_s > 0 for row in r.roofline)
    assert set(r.peak_flops_per_s) == {"float32"} and r.peak_bytes_per_s > 1e8 and r.mfu > 0
    ridge = r.peak_flops_per_s["float32"] / r.peak_bytes_per_s
    assert rows["aten::mm"].intensity > ridge > rows["aten::add"].intensity
    text = r.to_text()
    assert "Roofline on the measured peaks (the ridge: float32 at " in text and "Model FLOPs utilisation" in text
    assert "the operators on the measured roofline" in r.to_html()
    again = torchmagic.profile(step, flops=True, steps=1, device=CpuDevice())
    assert again.peak_flops_per_s == r.peak_flops_per_s  # measured once per process
    assert peaks.measured_peaks(CpuDevice(), ("float32",)).flops_per_s == r.peak_flops_per_s


class _FullAccelerator(CpuDevice):
    """An accelerator (as the peaks see it) with ``free`` bytes left: its buffers live on the CPU here."""

    is_accelerator = True

    def __init__(self, free):
        super().__init__()
        self.free = free

    def memory_capacity(self):
        return self.free, 80 * 2**30


def test_on_a_gpu_the_peaks_take_a_share_of_free_memory_and_none_from_a_full_device(monkeypatch):
    sizes = []
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, **kw: sizes.append(shape[0]) or real_randn(*shape, **kw))
    monkeypatch.setattr(peaks, "MATMUL_MIN_S", 10.0)  # never fast enough: grow to the largest allowed
    monkeypatch.setattr(peaks, "_cache", {})
    roomy = peaks.measured_peaks(_FullAccelerator(free=8 * 16 * 2**20))  # 16 MiB for the buffers
    assert max(sizes) == 1024 and roomy.bytes_per_s > 0  # 4 x 1024² floats = 16 MiB
    monkeypatch.setattr(peaks, "_cache", {})
    try:
        peaks.measured_peaks(_FullAccelerator(free=8 * 2**19))  # 512 KiB: not even 256 x 256
    except peaks.PeaksUnmeasured as exc:
        assert "MiB of free device memory" in str(exc)
    else:
        raise AssertionError("measured peaks on a full device")
