"""%autobatch against the batch-size finders users already have, on one step with a simulated OOM.

    pip install lightning accelerate      # benchmark-only: torchmagic does not depend on them
    python -m benchmarks.autobatch_vs_anchors

The step allocates 1 MiB of real memory per sample and raises torch.OutOfMemoryError past
LIMIT samples, as a GPU would.  Each tool searches for the largest size, once with its own
defaults (torchmagic keeps 10% of the budget free, Lightning's binsearch takes 5% off its answer
where its version has a margin) and once with no margin, so the answers compare like for like; the
table gives the sizes it ran, the steps it executed, its wall time, its answer, and whether the
answer is one it actually ran successfully.  Lightning is found as ``lightning`` or as the older
``pytorch_lightning`` package.
"""

from __future__ import annotations

import inspect
import tempfile
import time
import warnings
from collections import Counter

import torch

from benchmarks.machine import machine_line
import torchmagic
from torchmagic.core.devices import CpuDevice

LIMIT = 1000            # the largest batch that "fits"
PER_SAMPLE = 2**20      # bytes allocated per sample


class SimulatedStep:
    """One training step's memory, recorded per call: which sizes ran and which failed."""

    def __init__(self):
        self.calls: Counter = Counter()
        self.ok: set[int] = set()

    def __call__(self, batch_size: int) -> torch.Tensor:
        self.calls[batch_size] += 1
        if batch_size > LIMIT:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {batch_size * PER_SAMPLE} bytes (simulated)")
        activations = torch.ones(batch_size * PER_SAMPLE // 4)
        self.ok.add(batch_size)
        return activations.sum()


def run_torchmagic(margin: float | None) -> dict:
    """With its default margin (None), or the one given; the budget is the simulated device's size."""
    step = SimulatedStep()
    started = time.perf_counter()
    kwargs = {} if margin is None else {"margin": margin}
    result = torchmagic.autobatch(step, budget=(LIMIT + 0.5) * PER_SAMPLE, restore=[], device=CpuDevice(), **kwargs)
    return _row(f"torchmagic %autobatch ({_margin_label(margin, 'default margin 0.1')})", step,
                result.batch_size, time.perf_counter() - started)


def _margin_label(margin: float | None, default: str) -> str:
    return default if margin is None else f"margin {margin:g}"


def _lightning():
    """(pytorch module, Tuner) from ``lightning`` or, failing that, ``pytorch_lightning``."""
    try:
        import lightning.pytorch as pl
        from lightning.pytorch.tuner import Tuner
    except ImportError:
        import pytorch_lightning as pl
        from pytorch_lightning.tuner import Tuner
    return pl, Tuner


def run_accelerate(start: int) -> dict:
    from accelerate.utils import find_executable_batch_size

    step = SimulatedStep()
    started = time.perf_counter()

    @find_executable_batch_size(starting_batch_size=start)
    def train(batch_size):
        step(batch_size)
        return batch_size

    answer = train()
    return _row(f"accelerate find_executable_batch_size (start {start})", step, answer,
                time.perf_counter() - started)


def run_lightning(mode: str, margin: float | None = None) -> dict:
    pl, Tuner = _lightning()
    step = SimulatedStep()

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 2
            self.layer = torch.nn.Linear(1, 1)

        def train_dataloader(self):
            data = torch.utils.data.TensorDataset(torch.zeros(100_000, 1))
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

        def training_step(self, batch, _):
            return step(batch[0].shape[0]) * 0 + self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tempfile.mkdtemp())  # its tuner checkpoints go there
    tuner = Tuner(trainer)
    kwargs = {}
    if margin is not None:
        if "margin" not in inspect.signature(tuner.scale_batch_size).parameters:
            raise ImportError(f"this {pl.__name__} {pl.__version__} has no margin (it takes nothing off)")
        kwargs["margin"] = margin
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        answer = tuner.scale_batch_size(Model(), mode=mode, init_val=2, max_trials=25, **kwargs)
    label = _margin_label(margin, "defaults")
    return _row(f"Lightning {pl.__version__} scale_batch_size ({mode}, {label})", step, answer,
                time.perf_counter() - started)


def _row(tool: str, step: SimulatedStep, answer: int | None, seconds: float) -> dict:
    return {"tool": tool, "sizes": len(step.calls), "steps": sum(step.calls.values()), "seconds": seconds,
            "answer": answer, "ran_ok": answer in step.ok, "of_limit": (answer or 0) / LIMIT}


def main() -> list[dict]:
    rows = [run_torchmagic(None), run_torchmagic(0.0)]
    for runner, args in ((run_lightning, ("power",)), (run_lightning, ("binsearch",)),
                         (run_lightning, ("binsearch", 0.0)), (run_accelerate, (128,)), (run_accelerate, (4096,))):
        try:
            rows.append(runner(*args))
        except ImportError as exc:
            rows.append({"tool": f"{runner.__name__}{args}", "missing": str(exc)})
    print(machine_line())
    print(f"Simulated step: 1 MiB per sample, out of memory past batch {LIMIT}")
    print(f"{'tool':58s} {'sizes':>5s} {'steps':>5s} {'time':>8s} {'answer':>7s} {'% of max':>8s}  ran it?")
    for r in rows:
        if "missing" in r:
            print(f"{r['tool']:58s} not run: {r['missing']}")
            continue
        print(f"{r['tool']:58s} {r['sizes']:5d} {r['steps']:5d} {r['seconds']:7.2f}s {r['answer']!s:>7s} "
              f"{r['of_limit']:8.0%}  {'yes' if r['ran_ok'] else 'NO'}")
    return rows


if __name__ == "__main__":
    main()
