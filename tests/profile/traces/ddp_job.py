"""A 2-rank DDP training job for torch.distributed.run (gloo, CPU) whose rank 1 has a slow input
pipeline (each sample waits, as on slow storage); every rank writes its trace with
tensorboard_trace_handler to the directory given as the first argument.

    python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_job.py OUT [--slow-rank R]
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--slow-rank", type=int, default=1)
# seconds per sample on the slow rank: 32 x 2 ms = 64 ms a step, a signal a preemption of a few ms on a
# loaded machine cannot drown (6 steps: ~0.3 s more than 0.5 ms a sample)
parser.add_argument("--sample-wait", type=float, default=0.002)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)  # two ranks on a 2-core machine


class Samples(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        if rank == args.slow_rank:
            time.sleep(args.sample_wait)
        return torch.randn(64), torch.randn(8)


model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batches = iter(DataLoader(Samples(), batch_size=32))
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=4),
             on_trace_ready=tensorboard_trace_handler(args.out, worker_name=f"rank{rank}")) as prof:
    for _ in range(6):
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        prof.step()
dist.destroy_process_group()
