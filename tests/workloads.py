"""Small real CPU workloads, each built to trigger (or to avoid) one diagnosis rule."""

from __future__ import annotations

import gc
import math
import random
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchmagic import Technique, Variant


class SlowTransformDataset(Dataset):
    """Per-item Python work (a toy tokeniser): the input pipeline dominates the step."""

    def __init__(self, n: int = 64, dim: int = 32):
        self.n, self.dim = n, dim

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        text = " ".join(f"w{(i * 7 + j) % 101}" for j in range(400))
        counts = [0.0] * self.dim
        for word in text.split():
            counts[hash(word) % self.dim] += 1.0
        return torch.tensor(counts), torch.tensor([math.sin(i)])


def mlp(dim: int = 32, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def train_step_fn(model, batches, opt=None, read_loss_every_batch=False):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        total = torch.zeros(())
        for x, y in batches:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if read_loss_every_batch:
                total += loss.item()
            else:
                total += loss.detach()
        return total

    return step


def slow_loader_step():
    loader = DataLoader(SlowTransformDataset(), batch_size=16)
    return train_step_fn(mlp(), loader)


def fast_data_step():
    batches = [(torch.randn(256, 256), torch.randn(256, 1)) for _ in range(4)]
    return train_step_fn(mlp(256, 1024), batches)


def item_per_batch_step():
    batches = [(torch.randn(8, 32), torch.randn(8, 1)) for _ in range(20)]
    return train_step_fn(mlp(), batches, read_loss_every_batch=True)


def tiny_ops_step():
    xs = [torch.randn(4) for _ in range(8)]

    def step():
        acc = torch.zeros(4)
        for _ in range(60):
            for x in xs:
                acc = acc * 0.5 + x.sin()
        return acc

    return step


def big_matmul_inference_step(autocast: bool = False):
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).eval()
    x = torch.randn(256, 512)

    def step():
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return model(x)

    return step


def copy_heavy_step():
    x = torch.randn(512, 512)

    def step():
        out = []
        for _ in range(20):
            y = x.t().contiguous().to(torch.float64).to(torch.float32)
            out.append(y.sum())
        return out

    return step


def grad_inference_step(inference_mode: bool = False):
    model = mlp(64, 128)
    x = torch.randn(32, 64)

    def step():
        if inference_mode:
            with torch.inference_mode():
                return model(x)
        return model(x)  # builds an autograd graph nobody uses

    return step


def many_params_step(foreach: bool, fused: bool = False):
    params = nn.ParameterList([nn.Parameter(torch.randn(16)) for _ in range(150)])
    opt = torch.optim.Adam(params, lr=1e-3, foreach=foreach, fused=fused or None)

    def step():
        loss = sum((p * p).sum() for p in params)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


SPIN_S = 2e-3  # a Spinner's run before noise; SPIN_TWICE's does that run twice


def iterations_per_second() -> float:
    """How many of _spin's loop iterations this machine runs per second now."""
    n = 20_000
    while True:
        start = time.perf_counter()
        _spin(n)
        took = time.perf_counter() - start
        if took > 0.02:
            return n / took
        n *= 2


def _spin(iterations: float) -> None:
    for _ in range(int(iterations)):
        pass


class Spinner(nn.Module):
    """A model whose true speed ratio to SPIN_TWICE is known (1/2): work measured in loop iterations,
    scaled per run by injected noise (lognormal jitter, exponential outliers on 10% of runs) and load.

    SPIN_TWICE runs the same work twice, each with noise of its own, rather than one run of double
    length: a timed block of the faster model averages its calls (two here), and the median of a mean of
    skewed runs lies above a single run's, so a double-length run would put the ratio the interval aims
    at near 0.504, not 0.5 (simulated: coverage of 0.5 fell from 97% to 95.9%, 94.9% with three calls).
    The machine's own load (other processes on a shared CPU) changes how long the iterations take;
    the injected load swings slowly and switches on and off every 23 ms, so rounds straddle it."""

    def __init__(self, rng: random.Random, rate: float, repeats: int = 1, started: float = 0.0):
        super().__init__()
        self.rng, self.rate, self.repeats, self.started = rng, rate, repeats, started or time.perf_counter()
        self.gc_enabled: list[bool] = []

    def forward(self):
        self.gc_enabled.append(gc.isenabled())
        for _ in range(self.repeats):
            now = time.perf_counter() - self.started
            load = (1 + 0.3 * math.sin(now / 0.37)) * (1.6 if int(now / 0.023) % 3 == 0 else 1.0)
            noise = self.rng.lognormvariate(0, 0.05) * (1 + self.rng.expovariate(1) if self.rng.random() < 0.1 else 1)
            _spin(SPIN_S * self.rate * noise * load)
        return torch.ones(1)


def _twice(model, env):
    return Spinner(model.rng, model.rate, 2 * model.repeats, model.started)


SPIN_TWICE = Variant("twice", (Technique("twice", build=_twice),))
