"""Read a Chrome/Perfetto trace JSON (plain or gzipped) one event at a time, in bounded memory.

``json.load`` of a 250 MB trace builds a million dicts at once (gigabytes).  Here the top-level
object is walked key by key and the ``traceEvents`` array element by element, each decoded by
the C scanner of :class:`json.JSONDecoder` (``raw_decode``) from a sliding text buffer: memory
is the buffer plus one event.  Keys other than ``traceEvents`` (``distributedInfo``,
``deviceProperties``, ``baseTimeNanoseconds`` ...) are small and kept as ``meta``.  A bare JSON
array of events (also valid Chrome trace format) is read the same way.

Whatever the file holds, memory stays bounded: a value cut by the buffer's end is first scanned
to its end (linear, without decoding), then decoded once, and only if it is small enough to keep
(``EVENT_CHARS`` for an event, ``META_CHARS`` for a top-level value); a bigger one is scanned past
and counted (``oversized``, ``skipped_meta``).  Only regular files are read (a FIFO would block).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Iterator
from typing import Any

from ....core.interrupts import deliver_pending, uninterruptible

CHUNK_CHARS = 1 << 20          # read this much text at a time
EVENT_CHARS = 8 << 20          # an event longer than this is scanned past, not decoded (and counted)
META_CHARS = 1 << 20           # ... a top-level value other than traceEvents, likewise
KEY_CHARS = 1024               # ... a top-level key, likewise (with its value)
MAX_NESTING = 64               # deeper JSON is not a trace (and would exhaust the C scanner's stack)
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SEPARATOR = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")
_PLAIN = re.compile(r'[^"\[\]{}]*')              # inside a container, up to a quote or bracket
_STRING = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*')  # inside a string, up to its closing quote
_SCALAR = re.compile(r'[^"\[\]{},:\s]*')         # a number or literal, up to what ends it


class TraceFileError(ValueError):
    """A file that is not a readable trace: one line saying which and why."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{shown_path(path)}: {problem}")
        self.path, self.problem = path, problem


def shown_path(text: str) -> str:
    """A path (or any text from the file) as it can be printed: bytes that are not UTF-8 (kept by
    os.fsdecode as lone surrogates, which no notebook can encode) and lone surrogates shown as U+FFFD."""
    if text.isascii():
        return text
    try:
        return os.fsencode(text).decode("utf-8", "replace")
    except UnicodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class TraceReader:
    """Iterate a trace file's events; ``meta`` holds its other top-level keys once read.

    Every element of ``traceEvents`` is yielded, whatever its type (``index`` is its position);
    one too long to keep is not, and counts in ``oversized``.  Keys after ``traceEvents``
    (kineto writes ``traceName`` there) are in ``meta`` after the events have been iterated to the
    end; top-level values too long to keep are left out and named in ``skipped_meta``."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        self.meta: dict[str, Any] = {}
        self.bytes_read = 0
        self.index = -1
        self.oversized = 0
        self.skipped_meta: list[str] = []
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._file = None
        self._offset = 0  # characters dropped from the buffer's start

    # -- the buffer ------------------------------------------------------------------------
    def _open(self):
        """The file as text; anything but a regular file is refused before a read could block."""
        try:  # O_NONBLOCK: opening a FIFO with no writer returns at once (it is refused below)
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise self._error(f"cannot be opened ({exc.strerror or exc})") from None
        raw = os.fdopen(fd, "rb")
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                        else "not a regular file")
                raise self._error(f"is {kind}: only regular files are read as traces")
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
        except BaseException:
            raw.close()
            raise
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
        return raw, io.TextIOWrapper(stream, encoding="utf-8", errors="strict", newline="")

    def _error(self, problem: str) -> TraceFileError:
        return TraceFileError(self.path, problem)

    def _more(self) -> bool:
        """Append the next chunk (as much as the buffer holds, so a long value is read in a
        logarithmic number of reads); False at the end of the file."""
        if self._eof:
            return False
        try:
            chunk = self._file.read(max(CHUNK_CHARS, len(self._buf) - self._pos))
        except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
            raise self._error(f"cannot be read ({type(exc).__name__}: {exc})") from None
        if not chunk:
            self._eof = True
            return False
        self.bytes_read += len(chunk)
        if self._pos > len(self._buf) // 2:  # drop what was consumed, now and then
            self._offset += self._pos
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
            raise self._error(f"is not a trace: expected {' or '.join(map(repr, chars))} {where}, found {got}")
        self._pos += 1
        return found

    def _scan(self, what: str, keep: int, where: str = "") -> int | None:
        """Find the end of the JSON value at the cursor without decoding it (linear in its length,
        whatever the buffer's chunks): its length if it is at most ``keep`` characters (the cursor
        stays at its start), else None with the cursor past it (dropping it as it goes)."""
        keeping, scanned = True, 0          # scanned: characters past the cursor
        mode, depth = None, 0               # None (not started), "scalar", "string", "container"
        while True:
            at = self._pos + scanned
            if at >= len(self._buf) - 1 and not self._eof:  # a token or an escape may be cut here
                keeping = keeping and scanned <= keep
                if not keeping:
                    self._pos, scanned = at, 0
                self._more()
                continue
            buf = self._buf
            if at >= len(buf):
                if mode == "scalar":
                    break
                raise self._error(f"ends in the middle of {what} (truncated?)")
            if mode is None:
                char = buf[at]
                mode = "string" if char == '"' else "container" if char in "[{" else "scalar"
                depth = 1 if mode == "container" else 0
                at += mode != "scalar"
            elif mode == "scalar":
                at = _SCALAR.match(buf, at).end()
                if at < len(buf) or self._eof:
                    break
            elif mode == "string":
                at = _STRING.match(buf, at).end()
                if at < len(buf) and buf[at] == '"':
                    at += 1
                    if depth == 0:
                        break
                    mode = "container"
                elif self._eof:  # a string left open (or ending in a lone backslash) at the end
                    raise self._error(f"ends in the middle of {what} (truncated?)")
            else:
                at = _PLAIN.match(buf, at).end()
                if at < len(buf):
                    char = buf[at]
                    at += 1
                    if char == '"':
                        mode = "string"
                    elif char in "[{":
                        depth += 1
                        if depth > MAX_NESTING:
                            raise self._error(f"is not a trace: {what}{where} is nested more than {MAX_NESTING} deep")
                    else:
                        depth -= 1
                        if depth == 0:
                            break
            scanned = at - self._pos
        length = at - self._pos
        if keeping and length <= keep:
            return length
        self._pos = at
        return None

    def _value(self, what: str, keep: int, where: str = "") -> Any:
        """Decode the JSON value at the cursor, or return ``SKIPPED`` (and step past it) when it is
        longer than ``keep`` characters.  ``where`` adds to ``what`` in a message (its index)."""
        self._peek()
        length = self._scan(what, keep, where)
        if length is None:
            return SKIPPED
        try:
            value, end = self._decoder.raw_decode(self._buf, self._pos)
            if end != self._pos + length:
                raise json.JSONDecodeError("extra data", self._buf, end)
        except json.JSONDecodeError as exc:
            raise self._error(f"is not a trace: invalid JSON in {what}{where} ({exc.msg})") from None
        except ValueError:  # an integer of more digits than Python converts
            raise self._error(f"is not a trace: {what}{where} holds a number too long to read") from None
        except RecursionError:
            raise self._error(f"is not a trace: {what}{where} is nested too deeply") from None
        self._pos = end
        return value

    def _array(self) -> Iterator[Any]:
        """The traceEvents array's elements (its '[' read)."""
        return self._events()

    # -- the structure ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        raw, self._file = self._open()
        try:
            first = self._expect("{[", "at the start")
            if first == "[":
                yield from self._array()
            else:
                yield from self._object()
        finally:
            _close_both(self._file, raw)

    def _object(self) -> Iterator[Any]:
        found_events = False
        if self._peek() == "}":
            self._pos += 1
        else:
            while True:
                if self._peek() != '"':
                    raise self._error("is not a trace: its top level is not a JSON object")
                key = self._value("a key", KEY_CHARS)
                shown = f"a key of over {KEY_CHARS:,} characters" if key is SKIPPED else shortened(key)
                self._expect(":", f"after {shown}")
                if key == "traceEvents":
                    self._expect("[", "to open traceEvents")
                    found_events = True
                    yield from self._array()
                else:
                    keep = META_CHARS if key is not SKIPPED and len(self.meta) < MAX_META_KEYS else -1
                    value = self._value(f"the value of {shown}", keep)
                    if value is SKIPPED:
                        self.skipped_meta.append(shown)
                    else:
                        self.meta[key] = value
                if self._expect(",}", "between the top-level keys") == "}":
                    break
        if not found_events:
            raise self._error("is JSON but not a trace: it has no traceEvents")

    def _events(self) -> Iterator[Any]:
        if self._peek() == "]":
            self._pos += 1
            return
        while True:
            event, last = self._next_event()
            if event is not SKIPPED:
                yield event
            if last == "]":
                return

    def _next_event(self) -> tuple[Any, str]:
        """The event at the cursor (``SKIPPED`` if too long to keep) and the separator after it."""
        # the common case in one decode and one match; near the buffer's end, the careful path
        buf = self._buf
        try:
            event, end = self._decoder.raw_decode(buf, self._pos)
        except (ValueError, RecursionError):
            end = len(buf)
        found = _SEPARATOR.match(buf, end) if end < len(buf) else None
        if found is None or found.end() == len(buf):
            event = self._value("an event", EVENT_CHARS, f" (traceEvents[{self.index + 1}])")
            last = self._expect(",]", "between events")
            self._peek()  # on to the next event: a failed decode costs a count of the buffer's lines
        else:
            self._pos, last = found.end(), found.group(1)
        self.index += 1
        if event is SKIPPED:
            self.oversized += 1
        return event, last


SKIPPED = object()  # a value too long to keep, stepped over
MAX_META_KEYS = 256


def shortened(text: str, limit: int = 60) -> str:
    """A string from the file, quoted for a message: cut to ``limit`` characters, printable."""
    text = text if len(text) <= limit else text[:limit] + "…"
    return json.dumps(shown_path(text), ensure_ascii=False)


@uninterruptible
def _close_both(wrapper, raw) -> None:
    """The decoding wrapper and the file under it: a Ctrl-C between the two would leave the fd open."""
    try:
        wrapper.close()
    finally:
        raw.close()
    deliver_pending()
