"""What NVIDIA's datasheets give for the GPUs users meet most, shown beside the roofs measured here:
dense (no 2:4 sparsity) peak FLOP/s per dtype and memory bandwidth.  A datasheet's peak is a ceiling
no kernel reaches; the measured roof is what this machine's matmul and copy did."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Datasheet:
    name: str
    flops_per_s: dict[str, float]   # dtype -> dense peak
    bytes_per_s: float


T = 1e12
# the first whose pattern is found in the device's name (torch.cuda.get_device_name), most specific first
DATASHEETS = (
    (r"H200", Datasheet("H200 SXM", {"float32": 67 * T, "bfloat16": 989 * T, "float16": 989 * T}, 4.8 * T)),
    (r"H100 PCIe", Datasheet("H100 PCIe", {"float32": 51 * T, "bfloat16": 756 * T, "float16": 756 * T}, 2.0 * T)),
    (r"H100", Datasheet("H100 SXM", {"float32": 67 * T, "bfloat16": 989 * T, "float16": 989 * T}, 3.35 * T)),
    (r"A100-SXM4-80GB", Datasheet("A100 80GB SXM", {"float32": 19.5 * T, "bfloat16": 312 * T, "float16": 312 * T},
                                  2.039 * T)),
    (r"A100.*80GB", Datasheet("A100 80GB PCIe", {"float32": 19.5 * T, "bfloat16": 312 * T, "float16": 312 * T},
                              1.935 * T)),
    (r"A100", Datasheet("A100 40GB", {"float32": 19.5 * T, "bfloat16": 312 * T, "float16": 312 * T}, 1.555 * T)),
    (r"\bL4\b", Datasheet("L4", {"float32": 30.3 * T, "bfloat16": 121 * T, "float16": 121 * T}, 0.3 * T)),
    (r"\bT4\b", Datasheet("T4", {"float32": 8.1 * T, "float16": 65 * T}, 0.32 * T)),
    (r"V100-SXM2", Datasheet("V100 SXM2", {"float32": 15.7 * T, "float16": 125 * T}, 0.9 * T)),
)


def datasheet(device_name: str) -> Datasheet | None:
    return next((sheet for pattern, sheet in DATASHEETS if re.search(pattern, device_name)), None)
