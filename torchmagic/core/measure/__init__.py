"""Measurement primitives shared by the engines: synchronised timing and robust statistics."""

from .cpu_wait import CpuWait
from .rounds import BlockStart, Rounds, balanced_calls, calls_per_block
from .stats import PairedRatio, Summary, min_pairs, paired_ratio, summarize
from .timing import timed_block, timed_call

__all__ = ["BlockStart", "CpuWait", "PairedRatio", "Rounds", "Summary", "balanced_calls", "calls_per_block",
           "min_pairs", "paired_ratio", "summarize", "timed_block", "timed_call"]
