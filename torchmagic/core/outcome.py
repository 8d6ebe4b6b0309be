"""How running the user's code under a feature ends, for the magic and the API alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R")


@dataclass
class Outcome(Generic[R]):
    """The result (None if nothing was measured), the code's value (what a cell returns), and its
    error or interrupt: the caller shows the result, then re-raises the error."""

    result: R | None
    value: Any = None
    error: BaseException | None = None
