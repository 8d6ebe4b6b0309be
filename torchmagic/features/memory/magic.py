"""%gpumem and %%gpumem: parse the line, report devices, host and variables (report.py), free
them, reset peaks, watch in the background, or measure a cell; show the result."""

from __future__ import annotations

import weakref

from IPython.core.magic import line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from ...core.devices import visible_accelerators
from ...core.interrupts import deliver_pending, guarded, uninterruptible
from ...core.ipython import DEVICE_ARGUMENT, TorchMagicsBase, parse_argstring, usage_error, user_frames_only
from ...core.outcome import Outcome
from ...core.render.base import widget_frontend
from ...core.shell import is_history
from ...core.state import values_named
from .free import NotFreeable, free
from .holders import traceback_locals
from .pins import Pin, ipython_names, namespace_pins
from .report import memory_report
from .run import run_cell_memory
from .watch import MemoryWatch, check_interval
from .watch_result import WatchResult


@magics_class
class MemoryMagics(TorchMagicsBase):
    @magic_arguments()
    @argument("--free", nargs="*", metavar="NAME",
              help="delete these variables, drop what IPython keeps of them (Out, _, the last traceback), "
                   "collect and empty the cache; report what came back.  With no names: drop what only "
                   "IPython keeps (the output history and the last traceback)")
    @argument("--reset", action="store_true", help="reset torch's peak memory counters on every GPU")
    @argument("--watch", nargs="?", type=float, const=1.0, metavar="SECONDS",
              help="sample memory and utilisation in the background every SECONDS (default 1) while later "
                   "cells run; a live chart in JupyterLab")
    @argument("--stop", action="store_true", help="stop the watch and show what it saw")
    @argument("--top", type=int, default=10, metavar="K", help="variables listed (default 10)")
    @DEVICE_ARGUMENT
    @argument("-o", dest="output", metavar="NAME", help="store the result in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @line_cell_magic
    @user_frames_only
    def gpumem(self, line, cell=None):
        """Where did the memory go?  Every GPU (NVML and torch's allocator), the host, and the
        notebook variables holding tensor memory.

        %gpumem                       devices, host, largest variables (r = %gpumem keeps the result)
        %gpumem --free NAME [NAME...] delete them and what pins them in IPython; report what came back
        %gpumem --free                drop what only IPython's output history or last traceback holds
        %gpumem --reset               reset torch's peak counters
        %gpumem --watch [SECONDS]     sample in the background while later cells run; --stop ends it
        %%gpumem                      the cell's peak and net memory, and the variables holding the net

        Variables are walked without running any of their code (no properties, no __getattr__):
        tensors and gradients, modules, optimizer state, containers and objects' attributes, to a
        bounded depth; views and tied weights count once.  The cell's peak is read from the
        profiler's allocation events, so no peak counter you watch is reset.
        """
        __tracebackhide__ = True  # noqa: F841
        args = parse_argstring(self.gpumem, line, "%gpumem" if cell is None else "%%gpumem")
        self.check_output_name(args.output)
        # (not "in (None, False)": --watch 0 is 0.0, which equals False)
        actions = [a for a in ("free", "reset", "watch", "stop") if getattr(args, a) is not None
                   and getattr(args, a) is not False]
        if len(actions) > 1:
            raise usage_error(f"%gpumem: use one of --{', --'.join(actions)} at a time")
        if args.top < 1:
            raise usage_error("%gpumem: --top must be at least 1")
        if cell is not None:
            if actions:
                raise usage_error(f"%%gpumem measures a cell; --{actions[0]} is for the line magic %gpumem")
            return self._measure_cell(cell, args)
        if args.device is not None:
            raise usage_error("%gpumem shows every device; --device is for %%gpumem, which measures a cell")
        action = actions[0] if actions else None
        namespace, hidden = self.shell.user_ns, self.shell.user_ns_hidden
        if action == "reset":
            gpus = visible_accelerators()
            reset = [d.label for d in gpus if d.reset_peak_stats()]
            print("%gpumem: peak counters reset on " + ", ".join(reset) if reset
                  else "%gpumem: nothing to reset: " + ("torch keeps no peak counters on the CPU" if not gpus else
                                                        "this process has not used a GPU yet"))
            return None
        if action == "watch":
            return self._start_watch(args.watch)
        if action == "stop":
            if self._watch is None:
                raise usage_error("%gpumem: no watch is running (start one with %gpumem --watch)")
            with guarded():  # a Ctrl-C while it stops is raised once the thread is stopped
                result = self.stop_watch()
        elif action == "free":
            try:
                result = free(args.free, namespace, hidden=hidden, top=args.top, extra_pins=self._ipython_pins)
            except (NameError, NotFreeable) as exc:
                raise usage_error(f"%gpumem --free: {exc}") from None
        else:
            result = memory_report(namespace, hidden=hidden, top=args.top,
                                   pins=namespace_pins(namespace, ipython_names(namespace, hidden))
                                   + self._ipython_pins())
        return self.line_outcome(args, Outcome(result))

    _watch: MemoryWatch | None = None

    def _ipython_pins(self) -> list[Pin]:
        """The shell's own copies of its output history: the display hook keeps _, __ and ___ and
        pushes them into the namespace after every output, the table of hidden names keeps the
        values it was given (_, _N ...), and the last execution result keeps the previous value."""
        pins = []
        hook, hidden = self.shell.displayhook, self.shell.user_ns_hidden
        for name in ("_", "__", "___"):
            if hasattr(hook, name):
                pins.append(Pin("history", name, getattr(hook, name), lambda name=name: setattr(hook, name, "")))
        for name in [n for n in hidden if is_history(n) and n not in ("In", "Out", "_ih", "_oh", "_dh")]:
            pins.append(Pin("history", name, hidden[name], lambda name=name: hidden.__setitem__(name, "")))
        last = getattr(self.shell, "last_execution_result", None)  # the previous cell's value, until this one ends
        if getattr(last, "result", None) is not None:
            pins.append(Pin("history", "the last cell's result", last.result, lambda: setattr(last, "result", None)))
        handler = getattr(self.shell, "InteractiveTB", None)  # keeps the last traceback for %debug
        if getattr(handler, "tb", None) is not None:
            pins.append(Pin("traceback", "the last traceback", traceback_locals(handler.tb),
                            lambda: setattr(handler, "tb", None)))
        return pins

    def _start_watch(self, interval: float):
        try:
            check_interval(interval)
        except ValueError as exc:
            raise usage_error(f"%gpumem --watch: {exc.problem}") from None
        view = None
        if widget_frontend():  # an output updated in place: HTML, so the last reading stays in a saved notebook
            view = display({"text/plain": ""}, raw=True, display_id=True)
        watch = MemoryWatch(visible_accelerators(), interval,  # not started yet: a Ctrl-C so far leaves no thread
                            on_sample=(lambda w: view.update(w.result()._repr_mimebundle_(), raw=True))
                            if view else None)
        with guarded():  # a Ctrl-C from here is raised once the watch runs and is known, or not started at all
            self._watch_instead(watch)
        if view is None:
            print(f"%gpumem: watching every {interval:g} s in the background; %gpumem --stop shows what it saw")
        return None

    _stop_at_exit: weakref.finalize | None = None

    @uninterruptible
    def _watch_instead(self, watch: MemoryWatch) -> None:
        """Stop the watch that runs, if any, and start ``watch``: the thread is never left without its owner."""
        self.stop_watch()
        self._watch = watch.start()
        # a watch outlives neither these magics nor the process's shell: stopped when they are
        # collected (a reloaded extension's), and at exit, before the interpreter tears down
        self._stop_at_exit = weakref.finalize(self, watch.stop)
        deliver_pending()

    @uninterruptible
    def stop_watch(self) -> WatchResult | None:
        """Stop the watch, if one runs (unloading the extension does: no command could reach it after),
        and say what it saw."""
        watch, self._watch = self._watch, None
        if self._stop_at_exit is not None:
            self._stop_at_exit.detach()
            self._stop_at_exit = None
        result = watch.stop() if watch is not None else None
        deliver_pending()
        return result

    def _measure_cell(self, cell: str, args):
        __tracebackhide__ = True  # noqa: F841
        code = self.compile_cell(cell, "%%gpumem")
        namespace = self.shell.user_ns
        device = self.device(args.device, values_named(code.names, namespace), "%%gpumem")

        def run():
            __tracebackhide__ = True  # noqa: F841
            return code.run(namespace)

        try:
            run_result = run_cell_memory(run, namespace, hidden=self.shell.user_ns_hidden, device=device, top=args.top)
        except KeyboardInterrupt as exc:  # held while the measurement stopped, raised as the run ended
            self.interrupted(args, exc)
        return self.cell_outcome(args, run_result)


def stop_watch(shell) -> None:
    """``%unload_ext torchmagic`` and ``%reload_ext torchmagic``: stop the watch ``%gpumem --watch``
    started, before the magics that could stop it are replaced."""
    stop = getattr(shell.magics_manager.registry.get(MemoryMagics.__name__), "stop_watch", None)
    if stop is not None:
        stop()
