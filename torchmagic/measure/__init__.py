"""Measurement primitives shared by the engines: synchronised timing and robust statistics."""

from .stats import Summary, bootstrap_ratio_ci, summarize
from .timing import timed_call

__all__ = ["Summary", "bootstrap_ratio_ci", "summarize", "timed_call"]
