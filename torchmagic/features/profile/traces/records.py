"""The fast path of reading a trace: a slice of ``traceEvents`` decoded whole, in C, into typed records.

msgspec decodes a slice of a few MB of events into ``Record`` structs holding only the fields the
reports read (any other key is skipped by the decoder, unbuilt), far fewer objects than a dict per event.
What the decoder refuses (a field of another type, an integer beyond 64 bits, nesting past its limit,
a lone surrogate ...) sends the whole slice through the checked path (reader.py, fields.py), and a
record whose values need more than their type checked (``PlainFields`` says so) sends its own event
there: either way the figures, notes and one-line errors are the checked path's own.
"""

from __future__ import annotations

import json

import msgspec
from msgspec import UNSET, Raw, UnsetType, field

from .fields import INT_LIMIT, TEXT_CHARS, EventFields
from .reader import TraceFileError

EMPTY_LIST = Raw(b"[]")
LISTS_KEPT = 1 << 16  # distinct strings, and ops' input lists, remembered: past it, each is checked anew


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys the columns keep (event_table.py), each of the type kineto writes."""

    external: int | None = field(default=None, name="External id")
    external_before_1_10: int | None = field(default=None, name="external id")
    correlation: int = 0
    sequence: int = field(default=-1, name="Sequence number")
    dims: Raw = field(default=EMPTY_LIST, name="Input Dims")
    dtypes: Raw = field(default=EMPTY_LIST, name="Input type")
    concrete: Raw = field(default=EMPTY_LIST, name="Concrete Inputs")
    flops: int | float = 0
    nbytes: int = field(default=0, name="Bytes")
    device_type: int = field(default=0, name="Device Type")
    device_id: int = field(default=-1, name="Device Id")
    finished: bool = True
    collective: str | UnsetType = field(default=UNSET, name="Collective name")
    elements: int | UnsetType = field(default=UNSET, name="In msg nelems")
    dtype: str | None = None


NO_ARGS = Args()


class Record(msgspec.Struct, gc=False):
    """One event of the fields the reports read (None: absent or null, as ``dict.get`` reads them)."""

    ph: str | None = None
    name: str | None = None
    cat: str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    tid: int | str = 0
    args: Args | None = None


_DECODE = msgspec.json.Decoder(list[Record]).decode


def decode_slice(text: str) -> list[Record] | None:
    """The events of ``text`` (a JSON array of events), or None where the decoder refuses it."""
    try:
        return _DECODE(text)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None


class PlainFields:
    """A record's values where the checked path (``EventFields``) keeps them as they are, else None: a value
    to refuse, cut or replace sends that event through the checked path, which says what it says of it."""

    def __init__(self, check: EventFields):
        self.check = check
        self._texts: dict[str | None, str] = {None: ""}  # strings found plain, as kept
        # an op's input lists as kept, by their texts (Input Dims, Input type, Concrete Inputs): read where it is hot
        self.inputs: dict[tuple[bytes, bytes, bytes], tuple[list, list, list]] = {}

    def text(self, value: str | None) -> str | None:
        """A name or category as ``EventFields.text`` keeps it ('' for null), or None (long, or not ASCII)."""
        kept = self._texts.get(value)
        if kept is not None or not (len(value) <= TEXT_CHARS and value.isascii()):
            return kept
        kept = self.check.kept(value)
        if len(self._texts) < LISTS_KEPT:
            self._texts[value] = kept
        return kept

    def tid(self, value: int | str) -> int | str | None:
        if type(value) is int:
            return value if -INT_LIMIT < value < INT_LIMIT else None
        return self.text(value)

    def op_inputs(self, args: Args) -> tuple[list, list, list] | None:
        """An op's ``Input Dims``, ``Input type`` and ``Concrete Inputs`` as the checked path keeps them: read
        and checked once per distinct text; None where it refuses, cuts or leaves out what they hold."""
        texts = bytes(args.dims), bytes(args.dtypes), bytes(args.concrete)
        kept = self.inputs.get(texts)
        if kept is None:
            kept = self._checked_inputs(texts)
            if kept is not None and len(self.inputs) < LISTS_KEPT:
                self.inputs[texts] = kept
        return kept

    def _checked_inputs(self, texts: tuple[bytes, bytes, bytes]) -> tuple[list, list, list] | None:
        check = self.check
        counts = check.cut, check.dropped
        try:
            dims, dtypes, concrete = (json.loads(text) for text in texts)
            kept = (check.shapes({"Input Dims": dims}, {}, 0), check.texts({"Input type": dtypes}, "Input type", {}, 0),
                    check.texts({"Concrete Inputs": concrete}, "Concrete Inputs", {}, 0))
        except (ValueError, RecursionError, TypeError, TraceFileError):
            return None
        if (check.cut, check.dropped) != counts:  # counted when the checked path reads them
            check.cut, check.dropped = counts
            return None
        return kept
