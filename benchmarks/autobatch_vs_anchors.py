"""%autobatch against the batch-size finders users already have, on one step with a simulated OOM.

    pip install lightning accelerate      # benchmark-only: torchmagic does not depend on them
    python benchmarks/autobatch_vs_anchors.py

The step allocates 1 MiB of real memory per sample and raises torch.OutOfMemoryError past
LIMIT samples, as a GPU would.  Each tool searches for the largest size; the table gives the
sizes it ran, the steps it executed, its wall time, its answer, and whether the answer is one
it actually ran successfully.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from collections import Counter

import torch

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


def run_torchmagic() -> dict:
    step = SimulatedStep()
    started = time.perf_counter()
    # budget: the simulated device's size; no margin, so the answer can reach LIMIT itself
    result = torchmagic.autobatch(step, budget=(LIMIT + 0.5) * PER_SAMPLE, margin=0.0, restore=[],
                                  device=CpuDevice())
    return _row("torchmagic %autobatch", step, result.batch_size, time.perf_counter() - started)


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


def run_lightning(mode: str) -> dict:
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

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
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        answer = Tuner(trainer).scale_batch_size(Model(), mode=mode, init_val=2, max_trials=25)
    return _row(f"Lightning scale_batch_size ({mode})", step, answer, time.perf_counter() - started)


def _row(tool: str, step: SimulatedStep, answer: int | None, seconds: float) -> dict:
    return {"tool": tool, "sizes": len(step.calls), "steps": sum(step.calls.values()), "seconds": seconds,
            "answer": answer, "ran_ok": answer in step.ok, "of_limit": (answer or 0) / LIMIT}


def main() -> list[dict]:
    rows = [run_torchmagic()]
    for runner, arg in ((run_lightning, "power"), (run_lightning, "binsearch"),
                        (run_accelerate, 128), (run_accelerate, 4096)):
        try:
            rows.append(runner(arg))
        except ImportError as exc:
            rows.append({"tool": f"{runner.__name__}({arg})", "missing": str(exc)})
    print(f"Simulated step: 1 MiB per sample, out of memory past batch {LIMIT}; "
          f"{CpuDevice().name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    print(f"{'tool':58s} {'sizes':>5s} {'steps':>5s} {'time':>8s} {'answer':>7s} {'% of max':>8s}  ran it?")
    for r in rows:
        if "missing" in r:
            print(f"{r['tool']:58s} not installed ({r['missing']})")
            continue
        print(f"{r['tool']:58s} {r['sizes']:5d} {r['steps']:5d} {r['seconds']:7.2f}s {r['answer']!s:>7s} "
              f"{r['of_limit']:8.0%}  {'yes' if r['ran_ok'] else 'NO'}")
    return rows


if __name__ == "__main__":
    main()
