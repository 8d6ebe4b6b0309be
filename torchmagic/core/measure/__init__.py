"""Measurement primitives shared by the engines: synchronised timing and robust statistics."""

from .rounds import Rounds, calls_per_block
from .stats import Summary, bootstrap_ratio_ci, summarize
from .timing import timed_block, timed_call

__all__ = ["Rounds", "Summary", "bootstrap_ratio_ci", "calls_per_block", "summarize", "timed_block", "timed_call"]
