"""Read a Chrome/Perfetto trace JSON (plain or gzipped) one event at a time, in bounded memory.

``json.load`` of a 250 MB trace builds a million dicts at once (gigabytes).  Here the top-level
object is walked key by key and the ``traceEvents`` array element by element, each decoded by
the C scanner of :class:`json.JSONDecoder` (``raw_decode``) from a sliding text buffer: memory
is the buffer plus one event.  Keys other than ``traceEvents`` (``distributedInfo``,
``deviceProperties``, ``baseTimeNanoseconds`` ...) are small and kept as ``meta``.  A bare JSON
array of events (also valid Chrome trace format) is read the same way.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Iterator
from typing import Any

CHUNK_CHARS = 1 << 20          # read this much text at a time
MAX_ELEMENT_CHARS = 64 << 20   # a single event or meta value larger than this is not a trace
_CUT_TOKEN = 32                # an error this close to the buffer's end may be a token cut in two
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SEPARATOR = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")


class TraceFileError(ValueError):
    """A file that is not a readable trace: one line saying which and why."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


class TraceReader:
    """Iterate a trace file's events; ``meta`` holds its other top-level keys once read.

    Keys after ``traceEvents`` (kineto writes ``traceName`` there) are in ``meta`` after the
    events have been iterated to the end."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        self.meta: dict[str, Any] = {}
        self.bytes_read = 0
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._file = None

    # -- the buffer ------------------------------------------------------------------------
    def _open(self):
        with open(self.path, "rb") as probe:
            gzipped = probe.read(2) == b"\x1f\x8b"
        opener = gzip.open if gzipped else open
        return opener(self.path, "rt", encoding="utf-8", errors="strict", newline="")

    def _more(self) -> bool:
        """Append the next chunk; False at the end of the file."""
        if self._eof:
            return False
        try:
            chunk = self._file.read(CHUNK_CHARS)
        except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile) as exc:
            raise TraceFileError(self.path, f"cannot be read ({type(exc).__name__}: {exc})") from None
        if not chunk:
            self._eof = True
            return False
        self.bytes_read += len(chunk)
        if self._pos > len(self._buf) // 2:  # drop what was consumed, now and then
            self._buf, self._pos = self._buf[self._pos:], 0
        self._buf += chunk
        return True

    def _peek(self) -> str:
        """The next non-whitespace character ('' at the end of the file), not consumed."""
        while True:
            self._pos = _WHITESPACE.match(self._buf, self._pos).end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._more():
                return ""

    def _expect(self, chars: str, where: str) -> str:
        found = self._peek()
        if found == "" or found not in chars:
            got = "the end of the file (truncated?)" if found == "" else repr(found)
            raise TraceFileError(self.path, f"is not a trace: expected {' or '.join(map(repr, chars))} {where}, "
                                            f"found {got}")
        self._pos += 1
        return found

    def _value(self, what: str) -> Any:
        """Decode one JSON value at the cursor, reading more while it is cut off by the buffer."""
        self._peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                # cut off by the buffer's end (an error near it: a literal such as `tru|e` fails at its
                # start; a string left open), or invalid (the same error once more text is read)
                cut_off = exc.pos >= len(self._buf) - _CUT_TOKEN or exc.msg.startswith("Unterminated string")
                if cut_off and len(self._buf) - self._pos < MAX_ELEMENT_CHARS and self._more():
                    continue
                problem = (f"ends in the middle of {what} (truncated?)" if cut_off and self._eof
                           else f"is not a trace: invalid JSON in {what} ({exc.msg})")
                raise TraceFileError(self.path, problem) from None
            # a number at the buffer's end may continue in the next chunk
            if end == len(self._buf) and not self._eof and self._more():
                continue
            self._pos = end
            return value

    # -- the structure ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        try:
            self._file = self._open()
        except OSError as exc:
            raise TraceFileError(self.path, f"cannot be opened ({exc.strerror or exc})") from None
        try:
            first = self._expect("{[", "at the start")
            if first == "[":
                yield from self._events()
            else:
                yield from self._object()
        finally:
            self._file.close()

    def _object(self) -> Iterator[dict]:
        found_events = False
        if self._peek() == "}":
            self._pos += 1
        else:
            while True:
                key = self._value("a key")
                if not isinstance(key, str):
                    raise TraceFileError(self.path, "is not a trace: its top level is not a JSON object")
                self._expect(":", f"after the key {key!r}")
                if key == "traceEvents":
                    self._expect("[", "to open traceEvents")
                    found_events = True
                    yield from self._events()
                else:
                    self.meta[key] = self._value(f"the value of {key!r}")
                if self._expect(",}", "between the top-level keys") == "}":
                    break
        if not found_events:
            raise TraceFileError(self.path, "is JSON but not a trace: it has no traceEvents")

    def _events(self) -> Iterator[dict]:
        if self._peek() == "]":
            self._pos += 1
            return
        decode, separator = self._decoder.raw_decode, _SEPARATOR.match
        while True:
            # the common case in one decode and one match; near the buffer's end, the careful path
            buf = self._buf
            try:
                event, end = decode(buf, self._pos)
            except ValueError:
                end = len(buf)
            found = separator(buf, end) if end < len(buf) else None
            if found is None or found.end() == len(buf):
                event = self._value("an event")
                last = self._expect(",]", "between events")
                self._peek()  # on to the next event: a failed decode costs a count of the buffer's lines
            else:
                self._pos, last = found.end(), found.group(1)
            if isinstance(event, dict):
                yield event
            if last == "]":
                return
