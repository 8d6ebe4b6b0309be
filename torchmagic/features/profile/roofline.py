"""``--flops``: each heavy operator on the roofline of the device at hand.

The roofs are measured (core/measure/peaks.py): matmul FLOP/s per dtype, and copy bandwidth.  An op's
arithmetic intensity is its FLOPs over the bytes its tensors hold (inputs read and output written
once: the least traffic it can have); below the ridge (peak FLOP/s ÷ bandwidth) it is memory-bound,
above it compute-bound, and how close it comes is its achieved FLOP/s over the roof at its intensity.
"""

from __future__ import annotations

from ...core.devices import Device, is_out_of_memory
from ...core.devices.datasheets import datasheet
from ...core.measure.peaks import PeaksUnmeasured, measured_peaks
from .result import OpRow, RooflineRow

DTYPES = {"float": "float32", "c10::BFloat16": "bfloat16", "c10::Half": "float16"}
HEAVY_SHARE = 0.01   # ops below this share of the FLOP-carrying ops' time are left off


def roofline_fields(ops: list[OpRow], step_s: list[float], device: Device, notes: list[str]) -> dict:
    """The result's peaks, roofline rows and MFU (``--flops``) for its ``ops``; why none, in ``notes``."""
    on_device = any(op.self_device_us for op in ops)
    candidates = [op for op in ops if (op.flops or op.estimated_flops) and op.bytes and _us(op, on_device) > 0]
    if not candidates:
        notes.append("--flops: no operator with FLOPs and tensor sizes to place on a roofline.")
        return {}
    dtypes = tuple(sorted({DTYPES.get(op.dtype, "float32") for op in candidates}))
    try:
        peaks = measured_peaks(device, dtypes)
    except Exception as exc:  # the user's tensors fill the device
        if not isinstance(exc, PeaksUnmeasured) and not is_out_of_memory(exc):
            raise
        notes.append(f"--flops: the device's peaks were not measured (too little free memory: {exc}); "
                     "no roofline. Free memory (%gpumem) and profile again.")
        return {}
    fields = {"peak_flops_per_s": dict(peaks.flops_per_s), "peak_bytes_per_s": peaks.bytes_per_s,
              "roofline": _rows(candidates, on_device, peaks)}
    counted = [op for op in ops if op.flops]
    if counted and step_s:
        main = max(dtypes, key=lambda d: sum(op.flops for op in counted if DTYPES.get(op.dtype, "float32") == d))
        fields["mfu"] = sum(op.flops for op in counted) / sum(step_s) / peaks.flops_per_s[main]
    notes += _roof_notes(device, dtypes, peaks)
    return fields


def _rows(candidates: list[OpRow], on_device: bool, peaks) -> list[RooflineRow]:
    """The heavy candidates on the roofline, most time first."""
    total_us = sum(_us(op, on_device) for op in candidates)
    rows = []
    for op in candidates:
        us = _us(op, on_device)
        if us < HEAVY_SHARE * total_us:
            continue
        dtype = DTYPES.get(op.dtype, "float32")
        flops = op.flops or op.estimated_flops
        intensity = flops / op.bytes
        achieved = flops / (us / 1e6)
        compute_roof = peaks.flops_per_s[dtype]
        roof = min(compute_roof, intensity * peaks.bytes_per_s)
        rows.append(RooflineRow(op.name, dtype, flops, op.bytes, intensity, achieved,
                                "compute" if intensity * peaks.bytes_per_s >= compute_roof else "memory",
                                achieved / roof, estimated=not op.flops))
    return sorted(rows, key=lambda r: -r.flops / r.achieved_flops_per_s)


def _roof_notes(device: Device, dtypes: tuple[str, ...], peaks) -> list[str]:
    notes = []
    sheet = datasheet(device.name) if device.is_accelerator else None
    if sheet is not None:
        notes.append(f"{sheet.name} datasheet (dense), for comparison: "
                     + ", ".join(f"{d} {sheet.flops_per_s[d] / 1e12:.3g} TFLOP/s" for d in dtypes
                                 if d in sheet.flops_per_s)
                     + f"; memory {sheet.bytes_per_s / 1e9:.4g} GB/s.")
    where = f"with {peaks.threads} thread(s)" if peaks.threads else "on the GPU"
    notes.append(f"Roofs measured on this {device.kind.upper()} {where} in {peaks.seconds:.1f} s (once per "
                 "process): matmul " + ", ".join(f"{d} {f / 1e12:.3g} TFLOP/s" for d, f in
                                                  peaks.flops_per_s.items())
                 + f"; copy {peaks.bytes_per_s / 1e9:.3g} GB/s.")
    return notes


def _us(op, on_device: bool) -> float:
    """The time of an op's work: an op with counted FLOPs is counted where the formula applies (aten::convolution),
    above the ops that do the work (aten::mkldnn_convolution), so its time includes its children's."""
    if op.flops:
        return op.flop_device_us if on_device else op.total_cpu_us
    return op.self_device_us if on_device else op.self_cpu_us
