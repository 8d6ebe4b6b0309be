"""A CPU trial's footprint reads: how many, what it counts of them with its neighbours'
(footprint.FootprintCount), and what a trial in a new process (--fresh) reads."""

import gc

import torch

from torchmagic.core.devices import CpuDevice
from torchmagic.features.autobatch.footprint import FootprintCount, read_until_agreed
from torchmagic.features.autobatch.trial import run_first_trial, run_trial

from ..fakes import FakeCudaDevice

MiB = 2**20


def test_reads_stop_once_the_fewest_agree_and_go_on_to_the_most_while_they_do_not():
    reads = iter([100 * MiB, 100 * MiB, 130 * MiB, 100 * MiB, 90 * MiB, 70 * MiB])
    assert read_until_agreed(lambda: next(reads), (2, 5)) == (100 * MiB, 100 * MiB)
    assert read_until_agreed(lambda: next(reads), (2, 5), (80 * MiB,)) == (80 * MiB, 130 * MiB, 100 * MiB,
                                                                           90 * MiB, 70 * MiB)
    assert read_until_agreed(lambda: None, (2, 5), (80 * MiB,)) == (80 * MiB,)  # nothing more to read


def test_a_fixed_part_in_every_read_is_not_scaled_with_the_allocations():
    """A fresh process's reads: 20 MiB of first-use memory whatever the size, plus 2x what torch
    allocated, plus noise.  Per byte allocated, a small trial's reads look 10x a large one's; the
    line through them counts the small trial near its own reads, not its neighbours' ratio."""
    count = FootprintCount()
    noise = [0, 3 * MiB, -2 * MiB, 1 * MiB, -3 * MiB, 2 * MiB]
    for allocated in (2 * MiB, 3 * MiB, 4 * MiB):
        reads = tuple(20 * MiB + 2 * allocated + e for e in noise[:3])
        noise = noise[3:] + noise[:3]
        counted = count.counted(reads, allocated)
        assert max(reads) <= counted <= max(reads) + 12 * MiB, (allocated / MiB, counted / MiB)
    # per byte allocated, the 2 MiB trial's neighbours (up to 4 MiB) read 6-8 bytes a byte, it 12:
    # a bound from those ratios would put the next 4 MiB trial at 48+ MiB; the line, near 28 + spread
    assert count.counted((28 * MiB, 30 * MiB, 26 * MiB), 4 * MiB) < 40 * MiB


def test_reads_that_agree_per_byte_allocated_count_the_most_read():
    count = FootprintCount()
    assert count.counted((50 * MiB, 50 * MiB), 25 * MiB) == 50 * MiB
    assert count.counted((60 * MiB, 60 * MiB + 4096), 30 * MiB) == 60 * MiB + 4096


def test_a_first_trial_reads_the_first_steps_and_a_plain_trial_the_warmed_ones():
    """What --fresh reads in each new process: memory the step takes once (a library's first use)
    counts in its first steps' read; a plain trial's reads come after its allocations' run, warmed."""
    first_use = []

    def step(batch_size):
        if not first_use:
            first_use.append(b"\x01" * (64 * MiB))  # every page written: resident, kept for good
        torch.ones(batch_size, 1024).sum()

    device, reset = CpuDevice(), (lambda collect=True: None)
    # --fresh runs it in a new process; here, earlier tests' garbage collected inside the scope would free
    # more than the step takes (a read of 0 B, then of 58 MiB, in two runs of the suite): collected first
    gc.collect()
    device.empty_cache()
    fresh = run_first_trial(step, 256, device, reset)
    assert fresh.footprint_reads and fresh.footprint_reads[0] >= 60 * MiB and fresh.peak_bytes >= 60 * MiB
    assert 0 <= fresh.allocated_bytes - 256 * 1024 * 4 < 4096  # torch's allocations, read in the second run
    warmed = run_trial(step, 256, device, reset)
    assert warmed.peak_bytes < 16 * MiB


def test_a_first_trial_on_a_gpu_is_a_plain_trial_of_the_allocator():
    device = FakeCudaDevice(capacity_bytes=2**30)

    def step(batch_size):
        device.allocate(MiB * batch_size)
        device.free(MiB * batch_size)

    probe = run_first_trial(step, 8, device, lambda collect=True: device.empty_cache())
    assert probe.ran and probe.peak_bytes == 8 * MiB and probe.footprint_reads is None
