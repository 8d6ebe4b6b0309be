"""A step's live report against the report of the trace file the same profile wrote, on models torch.nn
defines (nobody here wrote them): ``torchmagic.profile(step, trace=path)``, then ``torchmagic.analyze(path)``.
Printed per model, with and without shapes: whether the findings are the same rules, the largest difference of a
category's share of the steps (points), and the two median steps.  Issue 52's bar: the same findings, shares
within 2 points, medians within 2%.

Run ``python -m benchmarks.live_against_file`` from the repository root; about half a minute.
"""

from __future__ import annotations

import os
import statistics
import tempfile

import torch

import torchmagic
from benchmarks.machine import machine_line


def _transformer():
    model = torch.nn.Transformer(d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                 dim_feedforward=128, batch_first=True)
    optimizer = torch.optim.AdamW(model.parameters())
    src, tgt = torch.randn(8, 16, 64), torch.randn(8, 12, 64)

    def step():
        optimizer.zero_grad()
        model(src, tgt).pow(2).mean().backward()
        optimizer.step()
    return step


def _lstm():
    model, head = torch.nn.LSTM(32, 64, num_layers=2, batch_first=True), torch.nn.Linear(64, 1)
    optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.01)
    x = torch.randn(16, 20, 32)

    def step():
        optimizer.zero_grad()
        out, _ = model(x)
        head(out).pow(2).mean().backward()
        optimizer.step()
    return step


def _shares(result) -> dict[str, float]:
    total = sum(result.categories_s.values()) or 1.0
    return {name: seconds / total for name, seconds in result.categories_s.items()}


def compare(make, shapes: bool) -> dict:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        live = torchmagic.profile(make(), steps=5, warmup=1, record_shapes=shapes, trace=path)
        filed = torchmagic.analyze(path).profile
    live_shares, file_shares = _shares(live), _shares(filed)
    return {"findings": (sorted(f.rule for f in live.findings), sorted(f.rule for f in filed.findings)),
            "share_points": 100 * max(abs(live_shares.get(c, 0.0) - file_shares.get(c, 0.0))
                                      for c in set(live_shares) | set(file_shares)),
            "median_ms": (statistics.median(live.step_s) * 1e3, statistics.median(filed.step_s) * 1e3)}


def main() -> None:
    print(machine_line(), f"| torch {torch.__version__}")
    for name, make in (("nn.Transformer (2+2 layers, AdamW)", _transformer), ("nn.LSTM (2 layers, SGD)", _lstm)):
        for shapes in (False, True):
            found = compare(make, shapes)
            (live_rules, file_rules), (live_ms, file_ms) = found["findings"], found["median_ms"]
            print(f"{name}, shapes {'on' if shapes else 'off'}: findings {'the same' if live_rules == file_rules else 'DIFFER'}"
                  f" ({', '.join(live_rules) or 'none'}; file: {', '.join(file_rules) or 'none'}); largest share "
                  f"difference {found['share_points']:.2f} points; median step {live_ms:.2f} ms live, {file_ms:.2f} ms "
                  f"from the file ({100 * abs(file_ms / live_ms - 1):.1f}%)")


if __name__ == "__main__":
    main()
