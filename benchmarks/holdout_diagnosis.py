"""The profile's deeper diagnosis on two hold-out models it was not written against: a small
transformer encoder whose step trains and then evaluates with grad left on, and a small CNN fed by a
DataLoader with a slow per-item transform.  Each check of issue 20 is printed with its figures: the
evaluation part found (inference_grad), the DataLoader fix's worker and thread counts against the
usable cores, the largest allocation's stack at the peak, matmuls and pointwise ops on the measured
roofline, and the diff of the CNN's profile before and after the loader fix.

    python -m benchmarks.holdout_diagnosis
"""

from __future__ import annotations

import re
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

import torchmagic
from benchmarks.machine import machine_line
from torchmagic.core.devices import CpuDevice
from torchmagic.core.limits import usable_cores


def encoder_step():
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(128, 4, 256, batch_first=True), 2)
    head = nn.Linear(128, 10)
    optimizer = torch.optim.AdamW([*encoder.parameters(), *head.parameters()], lr=1e-3)
    x, y, x_val = torch.randn(16, 64, 128), torch.randint(0, 10, (16,)), torch.randn(64, 64, 128)

    def embed_and_classify(batch):
        return head(encoder(batch).mean(1))

    def train_then_evaluate():
        loss = nn.functional.cross_entropy(embed_and_classify(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return embed_and_classify(x_val).argmax(1)  # evaluation, autograd left on

    return train_then_evaluate


def augment(images):
    for _ in range(20):  # an augmentation of 20 small tensor ops
        images = (images * 1.01).clamp_(-3, 3)
    return images


class SlowImages(Dataset):
    def __init__(self, transform=True):
        self.transform = transform

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        image = torch.randn(3, 32, 32)
        return (augment(image) if self.transform else image), i % 10  # per item, in Python


def collate_and_augment(items):  # the rule's other fix: the same augmentation once per batch
    images, labels = default_collate(items)
    return augment(images), labels


def cnn_step(loader):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    batches = iter(loader)

    def step():
        images, labels = next(batches)
        loss = nn.functional.cross_entropy(net(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def main() -> None:
    print(machine_line())
    cpu = CpuDevice()
    step = encoder_step()
    r = torchmagic.profile(step, steps=3, warmup=1, device=cpu)
    found = r.finding("inference_grad")
    print(f"transformer, train then evaluate: inference_grad {'found' if found else 'NOT found'}"
          + (f": {found.title}" if found else ""))

    m = torchmagic.profile(step, steps=2, warmup=1, memory=True, device=cpu)
    top = m.largest_allocations[0]
    print(f"transformer --memory: peak's largest allocation {top.bytes / 2**20:.1f} MiB by {top.op} in {top.module}, made in "
          f"{' <- '.join(top.stack[:3])}")

    f = torchmagic.profile(step, steps=2, warmup=1, flops=True, device=cpu)
    print(f"transformer --flops: roofs {', '.join(f'{d} {v / 1e9:.1f} GFLOP/s' for d, v in f.peak_flops_per_s.items())}, "
          f"copy {f.peak_bytes_per_s / 1e9:.1f} GB/s; MFU {f.mfu:.1%}")
    for row in f.roofline[:8]:
        print(f"  {row.name:<28} intensity {row.intensity:8.2f} FLOP/B  {row.bound:<7}  {row.fraction_of_roof:4.0%} "
              f"of its roof{'  (FLOPs estimated)' if row.estimated else ''}")

    loader = DataLoader(SlowImages(), batch_size=64)
    before = torchmagic.profile(cnn_step(loader), steps=4, warmup=1, device=cpu, label="cnn, 0 workers")
    fix = before.finding("dataloader")
    workers = re.search(r"num_workers=(\d+)", fix.snippet) if fix else None
    threads = re.search(r"set_num_threads\((\d+)\)", fix.snippet) if fix else None
    if fix is None:
        print("cnn: dataloader NOT found")
        return
    # on a CPU-only machine the finding gives both cases (the loading waits, or it computes): measure both fixes
    print(f"cnn: dataloader found on {usable_cores()} usable cores (torch threads {torch.get_num_threads()}); "
          f"predicted figure: {fix.expected.text() if fix.expected else 'none (the trace cannot tell)'}; "
          f"snippet: {workers[1] if workers else 'no'} worker(s), {threads[1] if threads else 'no'} thread(s)")
    fixes = [(f"cnn, {workers[1]} workers", DataLoader(SlowImages(), batch_size=64, num_workers=int(workers[1]),
                                                       persistent_workers=True), threads)] if workers else []
    fixes.append(("cnn, augmentation per batch", DataLoader(SlowImages(transform=False), batch_size=64,
                                                            collate_fn=collate_and_augment), None))
    for label, fixed_loader, threads_set in fixes:
        saved = torch.get_num_threads()
        if threads_set:
            torch.set_num_threads(int(threads_set[1]))
        try:
            started = time.perf_counter()
            after = torchmagic.profile(cnn_step(fixed_loader), steps=4, warmup=1, device=cpu, label=label)
            d = torchmagic.diff(before, after)
        finally:
            torch.set_num_threads(saved)
            del fixed_loader
        ci = f"{d.confidence:.0%} CI {d.ratio_ci[0]:.2f}-{d.ratio_ci[1]:.2f}" if d.ratio_ci else "no interval"
        print(f"cnn diff after the fix ({label}): {d.ratio:.2f}x the step time ({ci}), findings gone: "
              f"{[x.rule for x in d.findings_gone]}, new: {[x.rule for x in d.findings_new]} "
              f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
