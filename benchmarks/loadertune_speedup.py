"""What %loadertune finds for a CPU-heavy, GIL-bound transform (pure-Python tokenising).

    python -m benchmarks.loadertune_speedup

Prints the recommendation, the speedup of the loader alone over num_workers=0 with its 95%
CI, each setting's batches/s and first-batch latency, and the time the tuning took.
"""

from __future__ import annotations


import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.machine import machine_line
import torchmagic


class Tokenising(Dataset):
    """Each item hashes 30,000 characters' worth of "text" in pure Python: about 2 ms, holding the GIL."""

    def __len__(self):
        return 2048

    def __getitem__(self, i):
        h = 0
        for k in range(30_000):
            h = (h * 31 + k + i) % 1_000_003
        return torch.tensor([float(h % 97)]), i % 2


def main() -> None:
    print(machine_line())
    loader = DataLoader(Tokenising(), batch_size=16, shuffle=True)
    result = torchmagic.loadertune(loader)
    print(result.to_text())


if __name__ == "__main__":
    main()
