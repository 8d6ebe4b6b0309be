"""Result objects (plain data) and their views: text, HTML, ipywidgets, plots."""

from .base import Result
from .profile import Finding, OpRow, ProfileResult, TimelineSpan

__all__ = ["Finding", "OpRow", "ProfileResult", "Result", "TimelineSpan"]
