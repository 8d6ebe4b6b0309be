"""Measurement primitives shared by the engines: synchronised timing and robust statistics."""

from .stats import Summary, summarize
from .timing import timed_call

__all__ = ["Summary", "summarize", "timed_call"]
