"""A trace event's fields, checked where they are read.

A field of the wrong type (a string ``dur``, a NaN ``ts``, a list ``tid``, an ``args`` that is
not an object ...) refuses the file in one line naming it, the event (its index in traceEvents
and name) and the field: a trace that says something other than kineto writes is not one whose
figures can be trusted, and skipping such events would change the figures without a word.
Strings are kept printable (a lone surrogate, which no notebook can encode, becomes U+FFFD) and
at most ``TEXT_CHARS`` long (cut with a marker, and counted in ``cut`` for a note).
"""

from __future__ import annotations

import ast
import math
from typing import Any

from torch._C._autograd import DeviceType

from ....core.measure.low_precision import freeze
from .reader import TraceFileError, shortened

TEXT_CHARS = 1024        # a longer string keeps its start and a marker
DEVICE_TYPES = frozenset(int(t) for t in DeviceType.__members__.values())  # a memory record's device types
INT_LIMIT = 1 << 63      # ids, counts and times fit in 64 bits
MAX_DIMS = 64            # dimensions of one tensor
MAX_INPUTS = 4096        # an op's recorded inputs (Input Dims, Input type, Concrete Inputs)
_CUT = "…[cut: {} characters]"


def kind(value: Any) -> str:
    """A JSON value's type, as a message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else "infinite" if math.isinf(value) else f"{value:.6g}"
    if isinstance(value, int):
        return f"an integer of {len(str(value)):,} digits" if abs(value) >= INT_LIMIT else str(value)
    return type(value).__name__


class EventFields:
    """The checks for one trace file's events.  With ``share``, equal strings and lists are kept
    once (for events held together: a file that repeats an event costs one copy of its fields)."""

    def __init__(self, path: str, share: bool = False):
        self.path = path
        self.cut = 0  # strings cut to TEXT_CHARS
        self.dropped = 0  # lists (shapes, input types) of more than MAX_INPUTS entries, left out
        self._kept: dict | None = {} if share else None

    def refuse(self, ev: Any, index: int, field: str, problem: str) -> TraceFileError:
        name = ev.get("name") if isinstance(ev, dict) else None
        label = f" ({shortened(name)})" if isinstance(name, str) else ""
        return TraceFileError(self.path, f"traceEvents[{index}]{label}: {field} {problem}")

    def event(self, ev: Any, index: int) -> dict:
        if not isinstance(ev, dict):
            raise TraceFileError(self.path, f"traceEvents[{index}] is {kind(ev)}, not an object")
        return ev

    def time(self, ev: dict, index: int, key: str, default: float | None = None) -> float:
        """A time or duration in µs: a finite number (a duration not negative)."""
        value = ev.get(key, default)
        if type(value) is float:
            if math.isfinite(value) and (key != "dur" or value >= 0):
                return value
        elif type(value) is int and -INT_LIMIT < value < INT_LIMIT and (key != "dur" or value >= 0):
            return float(value)
        if value is None:  # missing or null: a duration is then 0, a time is needed
            if default is not None:
                return default
            raise self.refuse(ev, index, f"'{key}'", "is missing")
        wanted = "a number of 0 or more" if key == "dur" else "a finite number"
        return self._wrong(ev, index, f"'{key}'", value, wanted)

    def text(self, value: Any, ev: dict, index: int, field: str, default: str = "") -> str:
        """A string as kept: printable, at most TEXT_CHARS long."""
        if type(value) is not str:
            if value is None and default is not None:
                return default
            return self._wrong(ev, index, field, value, "a string")
        if len(value) > TEXT_CHARS:
            self.cut += 1
            value = value[:TEXT_CHARS] + _CUT.format(f"{len(value):,}")
        if not value.isascii():
            value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return value if self._kept is None else self._kept.setdefault(value, value)

    def kept(self, value: str) -> str:
        """A string already checked, kept once where strings are shared."""
        return value if self._kept is None else self._kept.setdefault(value, value)

    def name(self, ev: dict, index: int) -> str:
        return self.text(ev.get("name", ""), ev, index, "'name'")

    def args(self, ev: dict, index: int) -> dict:
        value = ev.get("args")
        if value is None:
            return {}
        if not isinstance(value, dict):
            return self._wrong(ev, index, "'args'", value, "an object")
        return value

    def integer(self, args: dict, key: str, default: int, ev: dict, index: int, low: int = -INT_LIMIT) -> int:
        """An integer argument (a bool is not one), between ``low`` and 2**63."""
        value = args.get(key, default)
        if type(value) is int and low <= value < INT_LIMIT:
            return value
        return self._wrong(ev, index, f'args["{key}"]', value,
                           "an integer" if low == -INT_LIMIT else f"an integer not below {low}")

    def number(self, args: dict, key: str, default: float, ev: dict, index: int) -> float:
        """A count such as flops: a finite number, not negative."""
        value = args.get(key, default)
        if type(value) in (int, float) and 0 <= value < INT_LIMIT:
            return value
        return self._wrong(ev, index, f'args["{key}"]', value, "a number of 0 or more")

    def hashable(self, value: Any, ev: dict, index: int, field: str) -> int | str:
        """A thread or stream id: an integer or a string."""
        if type(value) is int and -INT_LIMIT < value < INT_LIMIT:
            return value
        if type(value) is str:
            return self.text(value, ev, index, field)
        return self._wrong(ev, index, field, value, "an integer or a string")

    def shapes(self, args: dict, ev: dict, index: int) -> list:
        """``Input Dims``: per input, a tensor's sizes (a list of integers) or a tensor list's (a list of those)."""
        value = args.get("Input Dims", [])
        field = 'args["Input Dims"]'
        if self._too_long(value, ev, index, field) or any(self._too_long(shape, ev, index, field) for shape in value):
            return []
        for shape in value:
            nested = bool(shape) and type(shape[0]) is list
            for sizes in (shape if nested else [shape]):
                self._sizes(self._list(sizes, ev, index, field), ev, index, field)
        return self._shared(value)

    def _sizes(self, sizes: list, ev: dict, index: int, field: str) -> None:
        """One tensor's sizes: integers from 0, at most MAX_DIMS of them, whose product (its
        elements) fits in 64 bits, as a real tensor's does (so FLOP and byte counts stay finite)."""
        if len(sizes) > MAX_DIMS:
            raise self.refuse(ev, index, field, f"holds a shape of {len(sizes):,} dimensions (at most {MAX_DIMS})")
        for dim in sizes:
            if type(dim) is not int or not 0 <= dim < INT_LIMIT:
                held = repr(dim) if type(dim) is int and abs(dim) < INT_LIMIT else kind(dim)
                raise self.refuse(ev, index, field, f"holds {held} where a size (an integer from 0) belongs")
        if math.prod(sizes) >= INT_LIMIT:
            raise self.refuse(ev, index, field, "holds a shape of more than 2**63 elements")

    def texts(self, args: dict, key: str, ev: dict, index: int) -> list[str]:
        """``Input type``, ``Concrete Inputs``: a list of strings, each kept as ``text`` keeps it."""
        value = args.get(key, [])
        if self._too_long(value, ev, index, f'args["{key}"]'):
            return []
        field = f'args["{key}"]'
        return self._shared([self.text(item, ev, index, field, default=None) for item in value])

    def _shared(self, value: list) -> list:
        """``value``, or an equal list already kept (not to be changed: it may be shared)."""
        if self._kept is None or not value:
            return value
        return self._kept.setdefault(("list", freeze(value)), value)

    def _list(self, value: Any, ev: dict, index: int, field: str) -> list:
        if type(value) is not list:
            self._wrong(ev, index, field, value, "a list")
        return value

    def _too_long(self, value: Any, ev: dict, index: int, field: str) -> bool:
        """A list of more than MAX_INPUTS entries (an op on thousands of tensors) is left out, and
        counted: the op's time is still read, its shapes are not."""
        if len(self._list(value, ev, index, field)) <= MAX_INPUTS:
            return False
        self.dropped += 1
        return True

    def _wrong(self, ev: dict, index: int, field: str, value: Any, wanted: str):
        raise self.refuse(ev, index, field, f"is {kind(value)}, not {wanted}")


def literal(text):
    """A non-tensor input as the trace writes it ("[2, 2]", "False"; "" for a tensor) read as a value, None
    where it is not one."""
    if not isinstance(text, str):
        return text
    try:
        return ast.literal_eval(text) if text else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
