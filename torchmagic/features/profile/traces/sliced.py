"""A trace's events read in slices of a few MB, each decoded whole into typed records (records.py).

The reader (reader.py) walks the file as before, in the same bounded buffer; inside ``traceEvents`` it
cuts the buffered text after the last whole event of a slice and hands the slice to msgspec.  A slice the
decoder refuses, or a single event longer than a slice, is read by the checked path, event by event, over
exactly that text: its errors, skipped events and counts are the checked path's own.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator

from .reader import SKIPPED, TraceFileError, TraceReader
from .records import Record, decode_slice

SLICE_CHARS = 1 << 18  # text decoded at once: about 1,500 events (and as many records) held
_BOUNDARY = re.compile(r"\}[ \t\n\r]*(?:,[ \t\n\r]*\{|\])")  # an event's end, then the next or the array's end
_BETWEEN = re.compile(r"[ \t\n\r]*,?[ \t\n\r]*")  # between events in a slice's text
_CUTS_TRIED = 64  # '}' tried from a slice's end before the slice goes to the checked path


class Batch:
    """Events read together: ``records`` decoded by the typed path (``first`` the index of the first) from
    ``text`` (a JSON array of them), or ``events`` (dicts, or any JSON value) read by the checked path, one a batch."""

    __slots__ = ("first", "records", "_text", "_events", "_path")

    def __init__(self, first: int, records: list[Record] | None, text: str | None, events: list | None = None,
                 path: str = "trace"):
        self.first, self.records, self._text, self._events, self._path = first, records, text, events, path

    def events(self) -> list:
        """The batch's events as the checked path decodes them (the same C scanner, the same values)."""
        if self._events is None:
            try:
                self._events = json.loads(self._text)
            except (ValueError, RecursionError):
                raise self._refusal() from None
        return self._events

    def _refusal(self) -> TraceFileError:
        """The checked path's error for the first event that json refuses where msgspec read it (a number of
        more digits than Python converts, in a key the reports do not read)."""
        decoder, text, at = json.JSONDecoder(), self._text, 1
        for index in itertools.count(self.first):
            where = f"an event (traceEvents[{index}])"
            try:
                at = decoder.raw_decode(text, _BETWEEN.match(text, at).end())[1]
            except json.JSONDecodeError as exc:
                return TraceFileError(self._path, f"is not a trace: invalid JSON in {where} ({exc.msg})")
            except ValueError:
                return TraceFileError(self._path, f"is not a trace: {where} holds a number too long to read")
            except RecursionError:
                return TraceFileError(self._path, f"is not a trace: {where} is nested too deeply")


class SlicedTraceReader(TraceReader):
    """``TraceReader`` whose iteration yields ``Batch``es: ``meta``, ``index``, ``oversized`` and
    ``bytes_read`` as the plain reader keeps them."""

    def _array(self) -> Iterator[Batch]:
        if self._peek() == "]":
            self._pos += 1
            return
        while True:
            while len(self._buf) - self._pos < SLICE_CHARS and self._more():
                pass
            cut = self._slice_end()
            text = None if cut is None else "[" + self._buf[self._pos:cut] + "]"
            records = None if text is None else decode_slice(text)
            if records is not None:
                batch = Batch(self.index + 1, records, text, path=self.path)
                self.index += len(records)
                self._pos = cut
                last = self._expect(",]", "between events")
                self._peek()  # at the next event: the checked path decodes from there
                yield batch
            else:
                last = yield from self._checked(None if cut is None else self._offset + cut)
            if last == "]":
                return

    def _checked(self, stop: int | None) -> Iterator[Batch]:
        """The checked path's events up to ``stop`` (a position in the file's text; one event if None);
        returns the separator after the last."""
        while True:
            event, last = self._next_event()
            if event is not SKIPPED:
                yield Batch(self.index, None, None, [event], self.path)
            if last == "]" or stop is None or self._offset + self._pos >= stop:
                return last

    def _slice_end(self) -> int | None:
        """Where the last whole event within a slice from the cursor ends (after its '}', followed by the
        next event or the array's end), or None.  A '}' inside a string or a nested object cuts an event
        short: the decoder refuses that slice, which then goes through the checked path."""
        buf, low = self._buf, self._pos
        at = min(len(buf), low + SLICE_CHARS)
        for _ in range(_CUTS_TRIED):
            at = buf.rfind("}", low, at)
            if at < 0:
                return None
            if _BOUNDARY.match(buf, at):
                return at + 1
        return None
