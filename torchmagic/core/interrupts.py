"""Ctrl-C held off while torchmagic gives back what it took, so an interrupt leaves nothing behind.

A KeyboardInterrupt can land on any bytecode: between two lines that put a model's weights back,
or on the first instruction of the function that stops the profiler, before any line of it ran.
A flag set by that function would come too late, and so would a context manager (the signal can
be raised on entering its ``__enter__``).  What is early enough is the frame: while a run is
guarded (``guarded()``, entered before anything is acquired), SIGINT goes to a handler that looks
at the frames being executed.  Inside a function marked ``@uninterruptible`` (its own frame, or
any caller's) the signal is only remembered; anywhere else, the user's code above all, it goes to
the handler that was in place before (Python's raises KeyboardInterrupt; IPython's and the user's
own keep their meaning).  A remembered signal is raised by ``deliver_pending()``, the last
statement of a marked function that releases something, and at the latest when the guard ends.

What to mark: functions that give something back (stop a profiler, restore an fd, weights,
settings, gc).  Acquiring needs no mark, only an order: acquire inside the ``try`` whose
``finally`` releases, and release what was actually acquired (``if started: stop()``).  Signals
reach the main thread alone; elsewhere a guard changes nothing.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable)

_critical: set = set()   # code objects of the functions marked @uninterruptible
_depth = 0               # nesting of guards on the main thread
_pending = False         # a SIGINT arrived inside a marked function
_previous = None         # the SIGINT handler the outermost guard replaced


def uninterruptible(fn: F) -> F:
    """Mark ``fn``: a SIGINT that arrives while it (or anything it calls) runs is held until
    ``deliver_pending()``.  The function is returned as it is, without a wrapper, whose own
    first instruction would be a place to be interrupted."""
    _critical.add(fn.__code__)
    return fn


def _handler(signum, frame) -> None:
    global _pending
    __tracebackhide__ = True  # noqa: F841  (the KeyboardInterrupt shows the user's frames only)
    if _inside_marked(frame):
        _pending = True
    else:
        _deliver(_previous, frame)


class guarded:
    """Route SIGINT through the frame check for the scope (outermost scope on the main thread
    installs, the same one restores).  Enter it before acquiring anything."""

    __slots__ = ("_installed",)

    @uninterruptible
    def __enter__(self) -> guarded:
        global _depth, _previous, _pending
        self._installed = False
        if threading.current_thread() is not threading.main_thread():
            return self
        if _depth == 0:
            current = signal.getsignal(signal.SIGINT)
            if current is signal.SIG_IGN or current is None:
                return self  # ignored, or a handler set from C: not ours to wrap
            if current is not _handler:  # (ours only if a guard was torn down mid-way)
                _previous = current
            _pending = False
            signal.signal(signal.SIGINT, _handler)
            _hook_unraisable()
        _depth += 1
        self._installed = True
        return self

    @uninterruptible
    def __exit__(self, kind, exc, tb) -> None:
        global _depth, _previous, _pending
        if not self._installed:
            return
        _depth -= 1
        if _depth:
            return
        # Everything is given back before the handler: once Python's is in place again a Ctrl-C raises at the
        # next check point, so what came after it could be skipped (the unraisable hook was, when the swap
        # was followed by a call).  Until the swap, ours holds a Ctrl-C and it is raised below, once.
        _unhook_unraisable()
        previous, _previous = _previous, None
        if signal.getsignal(signal.SIGINT) is _handler:  # the user's code may have set its own
            signal.signal(signal.SIGINT, previous)
        if _pending:
            if kind is not None and issubclass(kind, KeyboardInterrupt):
                _pending = False  # already interrupting
            else:
                _deliver(previous, sys._getframe())


_previous_hook = None  # sys.unraisablehook while a guard is up


def _unraisable(unraisable) -> None:
    """A Ctrl-C that landed in a weakref callback or a ``__del__`` (torch.compile's caches have
    some) is an exception Python cannot raise there: it prints "Exception ignored" and drops it,
    and the magic would run on as if no Ctrl-C came.  Remember it instead, as inside a marked
    function: it is raised by the next ``deliver_pending()`` (the end of the next release), at the
    latest when the guard ends.  (Sending the signal again cannot work: its handler would run in
    this hook, right after the call that sends it, and be dropped again.)"""
    global _pending
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
        _pending = True
    elif _previous_hook is not None:
        _previous_hook(unraisable)


def _hook_unraisable() -> None:
    global _previous_hook
    if sys.unraisablehook is not _unraisable:
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable


def _unhook_unraisable() -> None:
    global _previous_hook
    if sys.unraisablehook is _unraisable:  # (the user's code may have set its own)
        sys.unraisablehook = _previous_hook
    _previous_hook = None


def deliver_pending() -> None:
    """Raise a held SIGINT, as the last statement of a marked function, once its release is done:
    unless a marked function further up is still at work (then that one delivers it)."""
    if not _pending or not _depth or threading.current_thread() is not threading.main_thread():
        return
    caller = sys._getframe(1)
    if not _inside_marked(caller.f_back):
        _deliver(_previous, caller)


def _inside_marked(frame) -> bool:
    while frame is not None:
        if frame.f_code in _critical:
            return True
        frame = frame.f_back
    return False


def _deliver(handler, frame) -> None:
    """Hand SIGINT to the handler that was in place (Python's raises KeyboardInterrupt)."""
    global _pending
    __tracebackhide__ = True  # noqa: F841
    _pending = False
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIG_DFL would end the process: inside a notebook, a KeyboardInterrupt is what is meant
        raise KeyboardInterrupt


def signal_handler_code():
    """The code of the SIGINT handler a guard installs (a Ctrl-C in the user's code is raised in
    it, one frame above theirs: the magics leave that frame out of what they show)."""
    return _handler.__code__


def is_guarded() -> bool:
    """Whether this thread's runs have SIGINT routed through the guard (for tests)."""
    return _depth > 0


class HeldScope:
    """A context manager whose ``acquire()`` and ``release()`` a Ctrl-C cannot split: it guards
    itself (the guard goes up before anything is acquired and down after everything is released),
    and a Ctrl-C that arrives in either is raised as soon as the release is done."""

    __slots__ = ("_guard",)

    def acquire(self) -> Any:
        return self

    def release(self) -> None:
        pass

    @uninterruptible
    def __enter__(self) -> Any:
        self._guard = guarded()
        self._guard.__enter__()
        try:
            acquired = self.acquire()
        except BaseException as exc:
            self._guard.__exit__(type(exc), exc, exc.__traceback__)
            raise
        if _pending:  # a Ctrl-C while acquiring: give it all back and raise it now, not at the end
            self.__exit__(None, None, None)       # raises it, unless an enclosing acquire is still at work
            _deliver(_previous, sys._getframe())  # then that one gives its part back on the way out
        return acquired

    @uninterruptible
    def __exit__(self, kind, exc, tb) -> None:
        try:
            self.release()
        finally:
            self._guard.__exit__(kind, exc, tb)
        deliver_pending()


def guards(fn: F) -> F:
    """Run ``fn`` (an engine's entry point) under ``guarded()``, so the releases it makes on the
    way out are protected from its first acquisition on."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841  (IPython leaves this frame out of tracebacks)
        with guarded():
            return fn(*args, **kwargs)
    return run  # type: ignore[return-value]
