"""Where a real Ctrl-C can land in Python code, and a way to make it land there.

CPython 3.11 runs a signal handler only where its eval loop checks for pending work:
* at a function's start, and where a generator resumes (``RESUME``): the handler sees that frame;
* after a call to C code returns (``CALL``, ``CALL_FUNCTION_EX``): the exception is raised at the call;
  a Python callee runs in its own frame, which has its own check points, and any of them raises
  out of it to the same call;
* at a backward jump (a loop's next turn).
A NOP (``try:``), a load or a store is never one.  Delivering SIGINT at every *line* (the older
sweep) also hits places no signal can reach, such as the first instruction of a ``finally`` before
the call that releases; delivering it at these check points hits exactly the places it can.

A point is ``(kind, code, offset)``: ``"entry"`` (the frame's start or a resume at ``offset``) or
``"op"`` (the call or jump at ``offset``).  ``points_reached`` records them as code runs;
``deliver_at`` returns the tracer and profiler that call the SIGINT handler in place at one, as
Python would call it, once.
"""

from __future__ import annotations

import dis
import os
import sys
from collections.abc import Callable
from typing import Any

CHECKS = frozenset({"CALL", "CALL_FUNCTION_EX", "JUMP_BACKWARD", "POP_JUMP_BACKWARD_IF_FALSE",
                    "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE"})
_CALLS = frozenset({"CALL", "CALL_FUNCTION_EX"})
_ops: dict[Any, dict[int, str]] = {}


def opname(code, offset: int) -> str | None:
    if code not in _ops:
        _ops[code] = {i.offset: i.opname for i in dis.get_instructions(code)}
    return _ops[code].get(offset)


def points_reached(run: Callable[[], Any], mine: Callable[[Any], bool]) -> list[tuple]:
    """The check points of the code objects ``mine`` accepts that ``run()`` reaches, in order."""
    seen: dict[tuple, None] = {}

    def local(frame, event, arg):
        if event == "opcode" and opname(frame.f_code, frame.f_lasti) in CHECKS:
            seen.setdefault(("op", frame.f_code, frame.f_lasti))
        return local

    def tracer(frame, event, arg):
        if not mine(frame.f_code):
            return None
        seen.setdefault(("entry", frame.f_code, frame.f_lasti))
        frame.f_trace_opcodes = True
        return local

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return list(seen)


def deliver_at(point: tuple, handler: Callable[[Any], None]):
    """(trace function, profile function, fired): ``handler(frame)`` is called once, at ``point``.

    A call's check is modelled where it happens: after a C callee returns (the profile function's
    ``c_return``, in the caller's frame), or as a Python callee returns (in its frame, raising out
    of it to the call), or, for a callable that reports neither (a type, a C object), just before
    the caller's next instruction."""
    kind, code, offset = point
    fired: list[tuple] = []
    armed: list[Any] = []  # the frame whose call at ``offset`` is running

    def fire(frame):
        armed.clear()
        if not fired:
            fired.append(point)
            handler(frame)

    def callee(frame, event, arg):
        if event == "exception":  # unwinding, unless a later line shows it was caught
            unwinding[frame] = True
        elif event == "line":
            unwinding.pop(frame, None)
        elif event == "return" and armed and frame.f_back is armed[0]:
            if unwinding.pop(frame, None):
                armed.clear()  # it raised: no check happens after a call that failed
            else:
                fire(frame)
        return callee

    unwinding: dict[Any, bool] = {}

    def local(frame, event, arg):
        if event != "opcode" or fired:
            return local
        if armed and armed[0] is frame:
            fire(frame)  # the call reported nothing (see above)
        elif frame.f_lasti == offset:
            if opname(code, offset) in _CALLS:
                armed.append(frame)
            else:
                fire(frame)
        return local

    def tracer(frame, event, arg):
        if fired:
            return None
        if armed and frame.f_back is armed[0]:
            return callee
        if frame.f_code is not code:
            return None
        if kind == "entry" and frame.f_lasti == offset:
            fire(frame)
            return None
        frame.f_trace_opcodes = True
        return local

    def profiler(frame, event, arg):
        if event == "c_return" and armed and frame is armed[0]:
            fire(frame)

    return tracer, profiler, fired


def run_interrupted_at(run: Callable[[], Any], point: tuple) -> tuple[bool, Any]:
    """(whether the Ctrl-C was delivered, ``run()``'s value): ``run`` with SIGINT delivered at ``point``, to the
    handler in place, as Python calls it."""
    import signal

    def handler(frame):
        signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)

    tracer, profiler, fired = deliver_at(point, handler)
    sys.settrace(tracer)
    sys.setprofile(profiler)
    try:
        value = run()
    finally:
        sys.setprofile(None)
        sys.settrace(None)
    return bool(fired), value


def describe(point: tuple, root: str) -> str:
    kind, code, offset = point
    line = next((i.positions.lineno for i in dis.get_instructions(code) if i.offset == offset and i.positions), None)
    what = "start" if kind == "entry" and offset <= 2 else "resume" if kind == "entry" else opname(code, offset)
    return f"{os.path.relpath(code.co_filename, root)}:{line or code.co_firstlineno} ({code.co_name}, {what} @{offset})"
