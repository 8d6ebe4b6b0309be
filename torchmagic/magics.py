"""IPython glue only: parse arguments, call the engine, display the result."""

from __future__ import annotations

import ast
import functools
import os
import re

from IPython.core import error as ipython_error
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.utils.process import arg_split
from IPython.display import display

from .cell import Cell
from .engines.autobatch import AutobatchOptions, run_autobatch
from .engines.compare import CompareOptions, run_compare
from .engines import memory as memory_engine
from .engines.holders import is_history, is_internal, traceback_locals
from .engines.pins import Pin, namespace_pins
from .engines.loadertune import LoaderTuneOptions, as_loader, run_loadertune
from .engines.memwatch import MemoryWatch
from .devices.profiler import ProfilerBusyError
from .engines.profile import ProfileOptions, run_profile
from .engines.state import is_stateful, objects_for_model, objects_used_by, referenced_values, values_named
from .engines.variants import DEFAULT_VARIANTS, TECHNIQUES, parse_variants
from .interrupts import signal_handler_code
from .devices import Device, choose_device, visible_accelerators
from .results.base import widget_frontend
from .results.autobatch import AutobatchResult
from .results.compare import CompareResult
from .results.loadertune import LoaderTuneResult
from .results.memory import MemoryResult
from .results.profile import SORT_KEYS, ProfileResult


def usage_error(message: str) -> ipython_error.UsageError:
    """IPython's usage error (shown as one line, no traceback), kept to one short line however
    much input it quotes: IPython expands $name in a magic's line, so a quoted option can hold a
    whole tensor's repr.  (IPython recognises the exact class, so this is not a subclass.)"""
    text = " ".join(message.split())
    return ipython_error.UsageError(text if len(text) <= 300 else text[:299] + "…")


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20,
          "g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40}


def parse_budget(text: str) -> float:
    """'8GiB', '512MB', '2e9' (bytes) or '0.9' (a fraction of memory)."""
    match = _SIZE.match(text)
    if not match:
        raise usage_error(f"--budget takes bytes such as 8GiB or 512MiB, or a fraction such as 0.9; got {text!r}")
    value = float(match.group(1)) * _UNITS[(match.group(2) or "").lower()]
    if value <= 0:
        raise usage_error(f"--budget must be positive, got {text!r}")
    return value


# Every magic that runs code measures one device: the one named here, else where its tensors are.
_DEVICE_ARGUMENT = argument(
    "--device", metavar="DEV", help="the device to measure: cpu, cuda, cuda:N, mps (default: where the "
    "code's model and tensors are; the CPU when none is on a GPU and this process has not used CUDA)")


def _user_frames_only(magic):
    """A Ctrl-C anywhere in a magic, parsing its arguments included, shows the user's frames only."""
    @functools.wraps(magic)
    def run(self, *args, **kwargs):
        __tracebackhide__ = True  # noqa: F841
        try:
            return magic(self, *args, **kwargs)
        except KeyboardInterrupt as exc:
            _raise_as_shown(exc)
    return run


@magics_class
class TorchMagics(Magics):
    @staticmethod
    def _device(spec: str | None, values: list, magic: str) -> Device:
        try:
            return choose_device(spec, values)
        except ValueError as exc:
            raise usage_error(f"{magic}: {exc}") from None

    def _cell_outcome(self, args, result, value, error):
        """How a cell magic ends: store the result (-o), show it unless -q, then re-raise the
        cell's own error (so "Run all" stops) or return the cell's value."""
        __tracebackhide__ = True  # noqa: F841
        if isinstance(error, KeyboardInterrupt):
            print(_interrupted_line(result))
        self._keep_and_show(args, result)
        if isinstance(error, KeyboardInterrupt):
            _raise_as_shown(error)
        if error is not None:
            raise error
        return value

    def _line_outcome(self, args, result):
        """How a line magic ends: store the result (-o) and return it, shown as Out[n] as any line
        magic's value is (`r = %magic` shows nothing); -q returns nothing, as %timeit -q does."""
        if args.output is not None:
            self.shell.user_ns[args.output] = result
        return None if args.quiet else result

    def _line_interrupted(self, args, interrupt: KeyboardInterrupt):
        """A Ctrl-C that came out of an engine (a line magic's, or one held until a release was done):
        one line on what was measured, the partial report (stored with -o, shown unless -q), then
        the interrupt as the user should see it."""
        __tracebackhide__ = True  # noqa: F841
        result = getattr(interrupt, "torchmagic_result", None)
        print(_interrupted_line(result))
        self._keep_and_show(args, result)
        _raise_as_shown(interrupt)

    def _keep_and_show(self, args, result) -> None:
        """Store a cell magic's or an interrupted magic's result (-o) and show it unless -q."""
        if result is not None:
            if args.output is not None:
                self.shell.user_ns[args.output] = result
            if not args.quiet:
                display(result)

    @staticmethod
    def _check_output_name(name: str | None) -> None:
        """Checked before anything runs, so a typo in -o costs nothing."""
        if name is not None and not name.isidentifier():
            raise usage_error(f"-o needs a Python variable name, got {name!r}")

    def _running_cell_number(self) -> int:
        """The number of the cell being run, as its prompt shows it: IPython counts a cell that
        stores history before running it, so execution_count is already the next one's."""
        running = getattr(self.shell.displayhook, "exec_result", None)
        return running.execution_count if running is not None else self.shell.execution_count

    def _cell(self, source: str, magic: str) -> Cell:
        if not source.strip():
            raise usage_error(f"{magic}: there is no code to measure")
        shell = self.shell
        try:
            return Cell(source, transform=shell.transform_cell,
                        register_source=lambda code: shell.compile.cache(code, self._running_cell_number(),
                                                                         raw_code=source))
        except SyntaxError:
            # Show it as IPython shows a cell's syntax error (the line and a caret, none of our
            # frames), then stop here with one line, so "Run all" stops too.
            shell.showsyntaxerror()
            raise usage_error(f"{magic}: the code has a syntax error (above); nothing ran") from None

    @magic_arguments()
    @argument("--steps", type=int, default=1, metavar="N",
              help="profile N runs of the cell, each marked as a step (default 1)")
    @argument("--warmup", type=int, default=0, metavar="N",
              help="run the cell N times un-profiled first; with N >= 2 the profiler's overhead is measured")
    @argument("--record-shapes", action="store_true", help="show operators' input shapes")
    @argument("--memory", action="store_true", help="record allocations: peak memory and bytes per operator")
    @argument("--stack", action="store_true",
              help="trace Python calls to rank your functions by the op time they call (slower)")
    @argument("--flops", action="store_true", help="estimate FLOPs of matmuls and convolutions")
    @argument("--trace", metavar="PATH", help="write a Chrome trace JSON (open it in ui.perfetto.dev)")
    @argument("--sort", default="auto", metavar="KEY",
              help="order operators by: auto (GPU time when present, else CPU), "
                   + ", ".join(sorted(set(SORT_KEYS))))
    @argument("--top", type=int, default=15, metavar="K", help="operators shown (default 15)")
    @_DEVICE_ARGUMENT
    @argument("-o", dest="output", metavar="NAME", help="store the ProfileResult in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @cell_magic
    @_user_frames_only
    def torchprofile(self, line, cell):
        """Profile the cell with torch.profiler and say what took the time and what to do about it.

        The cell runs as usual: its variables stay defined and its last expression is
        returned.  The report shows findings (bottleneck, fix, command to verify it), time by
        category, the top operators and a timeline.  If the cell raises, the profile of
        what ran is shown and the exception re-raised.
        """
        __tracebackhide__ = True  # noqa: F841
        args = parse_argstring(self.torchprofile, line)
        try:
            options = ProfileOptions(steps=args.steps, warmup=args.warmup, record_shapes=args.record_shapes,
                                     memory=args.memory, stack=args.stack, flops=args.flops,
                                     trace=args.trace, sort=args.sort, top=args.top)
        except ValueError as exc:
            raise usage_error(f"%%torchprofile: {exc}") from None
        self._check_output_name(args.output)
        code = self._cell(cell, "%%torchprofile")
        namespace = self.shell.user_ns
        device = self._device(args.device, values_named(code.names, namespace), "%%torchprofile")

        def step():
            __tracebackhide__ = True  # noqa: F841
            return code.run(namespace)

        try:
            run = run_profile(step, options, label="%%torchprofile", device=device, names=self._verify_names(code))
        except ProfilerBusyError as exc:
            raise usage_error(f"%%torchprofile: {exc}") from None
        except KeyboardInterrupt as exc:  # held while the profiler stopped, raised as the run ended
            self._line_interrupted(args, exc)
        run.result.verify_runner = self._verify_runner(cell)
        return self._cell_outcome(args, run.result, run.value, run.error)

    def _verify_names(self, code: Cell) -> dict[str, str]:
        """The notebook's names for the verify commands' placeholders: the DataLoader the cell uses."""
        from torch.utils.data import DataLoader

        loaders = sorted(n for n in code.names if isinstance(self.shell.user_ns.get(n), DataLoader))
        return {"loader": loaders[0]} if loaders else {}

    def _verify_runner(self, cell: str):
        """Runs a finding's verify command from the report's button: a cell magic on top of the
        profiled cell's code, a line magic as it is."""
        def run(command: str) -> None:
            self._in_button = True  # no progress line: updates to it do not reach a button's output area
            try:
                self.shell.run_cell(f"{command}\n{cell}" if command.startswith("%%") else command,
                                    store_history=False)
            finally:
                self._in_button = False

        return run

    _in_button = False

    def _progress(self, magic: str, quiet: bool) -> _Progress | None:
        """A status line for a long run, in a notebook cell (not in terminals, nor under a button)."""
        return _Progress(magic) if not quiet and not self._in_button and widget_frontend() else None

    @magic_arguments()
    @argument("--model", metavar="NAME",
              help="the nn.Module the cell uses; each variant's version stands in for it while the cell runs "
                   "(default: the one module with parameters that the cell names)")
    @argument("--variants", default=DEFAULT_VARIANTS, metavar="LIST",
              help=f"comma-separated, eager always included (default {DEFAULT_VARIANTS}); techniques: "
                   + ", ".join(TECHNIQUES) + "; combine with +, e.g. compile+amp")
    @argument("--runs", type=int, metavar="N", help="timed rounds (default: at least 10, until --min-time)")
    @argument("--min-time", type=float, default=1.0, metavar="S",
              help="seconds of timed runs per variant (default 1)")
    @argument("--warmup", type=int, default=3, metavar="N", help="untimed runs per variant after its first (default 3)")
    @argument("--dtype", metavar="DTYPE", help="autocast dtype for amp: bf16 or fp16 "
              "(default: bf16 where the device has it, else fp16)")
    @argument("--output", dest="compared", metavar="NAME",
              help="the variable compared with eager's after the cell (default: the cell's last expression)")
    @argument("--atol", type=float, metavar="X", help="absolute tolerance of the numerics check")
    @argument("--rtol", type=float, metavar="X",
              help="relative tolerance, times the largest |eager output| (default by precision: fp32 1e-4, "
                   "tf32 5e-3, fp16 1e-2, bf16 5e-2, int8 0.1)")
    @argument("--no-restore", action="store_true",
              help="do not snapshot and restore the model and optimizer (saves host memory; the runs train them)")
    @_DEVICE_ARGUMENT
    @argument("-o", dest="output", metavar="NAME", help="store the CompareResult in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @cell_magic
    @_user_frames_only
    def amp_compare(self, line, cell):
        """Compare eager fp32 with torch.compile, autocast and other variants on the cell's code.

        Each variant's version of the model (compiled, quantized ...) stands in for it while the
        cell runs, under the variant's context (autocast, inference_mode ...); the name is put
        back afterwards.  Variants run in interleaved rounds; the report gives each median,
        its speedup over eager with a 95% confidence interval, the compile time and the runs
        after which it pays off, peak memory, and the output's error against eager.  The model,
        its optimizers and the RNG are restored before each variant and afterwards; the cell's
        variables keep the values of its first eager run, which is also the value returned.
        """
        __tracebackhide__ = True  # noqa: F841
        args = parse_argstring(self.amp_compare, line)
        self._check_output_name(args.output)
        try:
            options = CompareOptions(
                variants=tuple(parse_variants(args.variants)), runs=args.runs, min_time=args.min_time,
                warmup=args.warmup, dtype=args.dtype.lower() if args.dtype else None, atol=args.atol,
                rtol=args.rtol, restore=not args.no_restore)
        except ValueError as exc:
            raise usage_error(f"%%amp_compare: {exc}") from None
        code = self._cell(cell, "%%amp_compare")
        namespace = self.shell.user_ns
        name = self._compare_model(args.model, code.names)
        model = namespace[name] if name else None
        state = (objects_for_model(model, code.names, namespace) if model is not None
                 else [namespace[n] for n in sorted(code.names) if is_stateful(namespace.get(n))])
        device = self._device(args.device, [model, *values_named(code.names, namespace)], "%%amp_compare")

        def run_cell(variant_model):
            __tracebackhide__ = True  # noqa: F841
            if name is None:
                return code.run(namespace)
            namespace[name] = variant_model
            try:
                return code.run(namespace)
            finally:
                namespace[name] = model  # never leave a compiled wrapper in the user's variables

        compared = args.compared
        if compared is not None and not compared.isidentifier():
            raise usage_error(f"--output needs a variable name, got {compared!r}")

        def output(value):
            if compared is None:
                return value
            if compared not in namespace:
                raise usage_error(f"%%amp_compare: the cell did not define {compared!r} (--output)")
            return namespace[compared]

        after_eager: dict = {}
        progress = self._progress("%%amp_compare", args.quiet)
        try:
            run = run_compare(run_cell, model, options, state=state, device=device, label="%%amp_compare",
                              output=output,
                              on_progress=progress.say if progress else None,
                              after_baseline=lambda: after_eager.update(namespace))
        except ProfilerBusyError as exc:
            raise usage_error(f"%%amp_compare: {exc}") from None
        except KeyboardInterrupt as exc:  # held while something was put back, raised as the run ended
            self._line_interrupted(args, exc)
        finally:
            if progress:
                progress.close()
        if after_eager:  # the variables as eager's first run left them, not as the last variant did
            # (internal names stay: removing dynamo's helper globals would make it recompile)
            for key in [k for k in namespace if k not in after_eager and not is_internal(k)]:
                del namespace[key]
            namespace.update(after_eager)
        return self._cell_outcome(args, run.result, run.value, run.error)

    def _compare_model(self, name: str | None, names: set[str]) -> str | None:
        import torch

        namespace = self.shell.user_ns
        if name is not None:
            if name not in namespace:
                raise usage_error(f"%%amp_compare: --model {name!r} is not defined")
            if not isinstance(namespace[name], torch.nn.Module):
                raise usage_error(f"%%amp_compare: --model {name!r} is a {type(namespace[name]).__name__}, "
                                 "not an nn.Module")
            return name
        modules = sorted(n for n in names if isinstance(namespace.get(n), torch.nn.Module))
        with_params = [n for n in modules if any(True for _ in namespace[n].parameters())]
        candidates = with_params or modules
        if len(candidates) > 1:
            raise usage_error(f"%%amp_compare: the cell uses several models ({', '.join(candidates)}); "
                             "say which one the variants change with --model NAME")
        return candidates[0] if candidates else None

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
    @_DEVICE_ARGUMENT
    @argument("-o", dest="output", metavar="NAME", help="store the result in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @line_cell_magic
    @_user_frames_only
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
        args = parse_argstring(self.gpumem, line)
        self._check_output_name(args.output)
        actions = [a for a in ("free", "reset", "watch", "stop") if getattr(args, a) not in (None, False)]
        if len(actions) > 1:
            raise usage_error(f"%gpumem: use one of --{', --'.join(actions)} at a time")
        if args.top < 1:
            raise usage_error("%gpumem: --top must be at least 1")
        if cell is not None:
            if actions:
                raise usage_error(f"%%gpumem measures a cell; --{actions[0]} is for the line magic %gpumem")
            return self._gpumem_cell(cell, args)
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
            result, self._watch = self._watch.stop(), None
        elif action == "free":
            try:
                result = memory_engine.free(args.free, namespace, hidden=hidden, top=args.top,
                                            extra_pins=self._ipython_pins)
            except NameError as exc:
                raise usage_error(f"%gpumem --free: {exc}") from None
        else:
            result = memory_engine.memory_report(namespace, hidden=hidden, top=args.top,
                                                 pins=namespace_pins(namespace) + self._ipython_pins())
        return self._line_outcome(args, result)

    _watch: MemoryWatch | None = None

    def _ipython_pins(self) -> list[Pin]:
        """The shell's own copies of its output history: the display hook keeps _, __ and ___ and
        pushes them into the namespace after every output, the table of hidden names keeps the
        values it was given (_, _N ...), and the last execution result keeps the previous value."""
        pins = []
        hook, hidden = self.shell.displayhook, self.shell.user_ns_hidden
        for name in ("_", "__", "___"):
            if hasattr(hook, name):
                pins.append(Pin("history", name, getattr(hook, name),
                                              lambda name=name: setattr(hook, name, "")))
        for name in [n for n in hidden if is_history(n) and n not in ("In", "Out", "_ih", "_oh", "_dh")]:
            pins.append(Pin("history", name, hidden[name],
                                          lambda name=name: hidden.__setitem__(name, "")))
        last = getattr(self.shell, "last_execution_result", None)  # the previous cell's value, until this one ends
        if getattr(last, "result", None) is not None:
            pins.append(Pin("history", "the last cell's result", last.result, lambda: setattr(last, "result", None)))
        handler = getattr(self.shell, "InteractiveTB", None)  # keeps the last traceback for %debug
        if getattr(handler, "tb", None) is not None:
            pins.append(Pin("traceback", "the last traceback", traceback_locals(handler.tb),
                                          lambda: setattr(handler, "tb", None)))
        return pins

    def _start_watch(self, interval: float):
        if not interval > 0:
            raise usage_error("%gpumem --watch: the interval must be a positive number of seconds")
        if self._watch is not None:
            self._watch.stop()
        view = None
        if widget_frontend():
            import ipywidgets

            view = ipywidgets.HTML()
            display(view)
        self._watch = MemoryWatch(visible_accelerators(), interval,
                                  on_sample=(lambda w: setattr(view, "value", w.result().to_html())) if view else None
                                  ).start()
        if view is None:
            print(f"%gpumem: watching every {interval:g} s in the background; %gpumem --stop shows what it saw")
        return None

    def _gpumem_cell(self, cell: str, args):
        __tracebackhide__ = True  # noqa: F841
        code = self._cell(cell, "%%gpumem")
        namespace = self.shell.user_ns
        device = self._device(args.device, values_named(code.names, namespace), "%%gpumem")

        def run():
            __tracebackhide__ = True  # noqa: F841
            return code.run(namespace)

        try:
            run_result = memory_engine.run_cell_memory(run, namespace, hidden=self.shell.user_ns_hidden,
                                                       device=device, top=args.top)
        except KeyboardInterrupt as exc:  # held while the measurement stopped, raised as the run ended
            self._line_interrupted(args, exc)
        return self._cell_outcome(args, run_result.result, run_result.value, run_result.error)

    @magic_arguments()
    @argument("--workers", metavar="LIST", help="worker counts to try, e.g. 0,1,2,4 (default: 0, powers of two, "
              "and the CPU count)")
    @argument("--batches", type=int, metavar="N", help="batches timed per pass (default: as many as fit in --seconds)")
    @argument("--seconds", type=float, default=0.5, metavar="S", help="seconds timed per pass (default 0.5)")
    @argument("--rounds", type=int, default=5, metavar="N", help="passes per setting, interleaved (default 5)")
    @argument("--step", metavar="NAME", help="a function taking a batch (a training step): also time it with the "
              "loaders, to tell whether the loader or the model is the bottleneck")
    @_DEVICE_ARGUMENT
    @argument("-o", dest="output", metavar="NAME", help="store the LoaderTuneResult in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @argument("loader", help="a DataLoader, or a dataset followed by DataLoader arguments: ds batch_size=64 shuffle=True")
    @argument("loader_kwargs", nargs="*", metavar="KEY=VALUE", help="DataLoader arguments when LOADER is a dataset")
    @line_magic
    @_user_frames_only
    def loadertune(self, line):
        """Find the DataLoader settings that feed batches fastest, and by how much.

        %loadertune loader                         a DataLoader in the notebook
        %loadertune dataset batch_size=64 shuffle=True

        Worker counts (0, powers of two, the CPU count) are compared with persistent workers,
        then the fastest without them and with a deeper prefetch; pin_memory with a GPU.  Each
        setting gets a fresh DataLoader from your dataset, sampler and collate function (yours
        is not iterated), timed in interleaved passes: the first batch (worker start-up) apart
        from batches/s after it.  A change is recommended only when it is faster with 95%
        confidence.  Every worker process is shut down afterwards.
        """
        __tracebackhide__ = True  # noqa: F841
        args = parse_argstring(self.loadertune, line)
        self._check_output_name(args.output)
        namespace = self.shell.user_ns
        if args.loader not in namespace:
            raise usage_error(f"%loadertune: {args.loader!r} is not defined")
        try:
            workers = tuple(int(w) for w in args.workers.split(",")) if args.workers else None
        except ValueError:
            raise usage_error(f"%loadertune: --workers takes counts such as 0,1,2,4; got {args.workers!r}") from None
        try:
            options = LoaderTuneOptions(workers=workers, batches=args.batches, seconds=args.seconds, rounds=args.rounds)
            loader = as_loader(namespace[args.loader], self._loader_kwargs(args.loader_kwargs))
        except ValueError as exc:
            raise usage_error(f"%loadertune: {exc}") from None
        step = None
        if args.step is not None:
            step = namespace.get(args.step)
            if not callable(step):
                raise usage_error(f"%loadertune: --step {args.step!r} is not a function defined in the notebook")
        device = self._device(args.device, referenced_values(step) if step else [], "%loadertune")
        progress = self._progress("%loadertune", args.quiet)
        try:
            result = run_loadertune(loader, options, step=step, label=args.loader, device=device,
                                    state=objects_used_by(step, namespace) if step else None,
                                    on_progress=progress.say if progress else None)
        except KeyboardInterrupt as exc:
            self._line_interrupted(args, exc)
        finally:
            if progress:
                progress.close()
        return self._line_outcome(args, result)

    def _loader_kwargs(self, items: list[str]) -> dict:
        """key=value pairs: Python literals, or names of the notebook's objects (collate_fn=pad)."""
        kwargs = {}
        for item in items:
            key, sep, text = item.partition("=")
            if not sep or not key.isidentifier():
                raise usage_error(f"%loadertune: DataLoader arguments are written key=value, got {item!r}")
            try:
                kwargs[key] = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                if text not in self.shell.user_ns:
                    raise usage_error(f"%loadertune: {key}={text} is neither a Python literal nor a defined name") from None
                kwargs[key] = self.shell.user_ns[text]
        return kwargs

    @magic_arguments()
    @argument("--budget", metavar="SIZE", help="memory the step may use: bytes (8GiB, 512MiB) or a fraction "
              "(0.9) of the GPU's memory or of available RAM on CPU; default 0.9 on a GPU, 0.5 on CPU")
    @argument("--min", type=int, default=1, metavar="N", help="smallest batch size to consider (default 1)")
    @argument("--max", type=int, default=65536, metavar="N", help="largest batch size to consider (default 65536)")
    @argument("--multiple-of", type=int, default=1, metavar="K", help="only sizes that are multiples of K")
    @argument("--margin", type=float, default=0.1, metavar="F",
              help="headroom kept free below the budget (default 0.1)")
    @argument("--target-batch", type=int, metavar="N",
              help="report the gradient-accumulation steps that reach batch N")
    @argument("--throughput", action="store_true",
              help="also time samples/s at the answer and smaller sizes, and name the knee")
    @argument("--no-estimate", action="store_true",
              help="fit on real runs only, not on fake-tensor estimates")
    @_DEVICE_ARGUMENT
    @argument("-o", dest="output", metavar="NAME", help="store the AutobatchResult in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @argument("step", nargs="?", help="a callable taking the batch size; or write `-- EXPR` with BS in it")
    @no_var_expand  # the line holds code: "{n}" and $name are the step's, not IPython's to fill in
    @line_magic
    @_user_frames_only
    def autobatch(self, line):
        """Find the largest batch size that runs without running out of memory.

        %autobatch [options] step          step(batch_size) builds a batch and runs one step
        %autobatch [options] -- EXPR       EXPR uses BS, e.g. model(torch.randn(BS, 3, 64, 64)).sum().backward()

        Peak memory is fitted against batch size from small runs, the largest size under the
        budget is predicted, and real runs verify it: the answer always ran.  The modules and
        optimizers the step uses are restored afterwards, so probing does not train the model.
        Returns the AutobatchResult (`r = %autobatch step` keeps it); with -q returns nothing.
        """
        __tracebackhide__ = True  # noqa: F841
        options_text, expression = _split_expression(line)
        args = parse_argstring(self.autobatch, options_text)
        self._check_output_name(args.output)
        try:
            options = AutobatchOptions(
                budget=parse_budget(args.budget) if args.budget is not None else None,
                min_size=args.min, max_size=args.max, multiple_of=args.multiple_of, margin=args.margin,
                target_batch=args.target_batch, throughput=args.throughput, estimate=not args.no_estimate)
        except ValueError as exc:
            raise usage_error(f"%autobatch: {exc}") from None
        step, label, values = self._autobatch_step(args.step, expression)
        state = objects_used_by(step, self.shell.user_ns)
        device = self._device(args.device, values, "%autobatch")
        progress = self._progress("%autobatch", args.quiet)
        try:
            result = run_autobatch(step, options, state=state, device=device, label=label,
                                   on_probe=progress.probe if progress else None)
        except ProfilerBusyError as exc:
            raise usage_error(f"%autobatch: {exc}") from None
        except KeyboardInterrupt as exc:
            self._line_interrupted(args, exc)
        finally:
            if progress:
                progress.close()
        return self._line_outcome(args, result)

    def _autobatch_step(self, name: str | None, expression: str | None):
        if expression is not None:
            if name is not None:
                raise usage_error("%autobatch: give a step callable or `-- EXPR`, not both")
            if not re.search(r"\bBS\b", expression):
                raise usage_error("%autobatch: the expression after -- must use BS for the batch size")
            code = self._cell(expression, "%autobatch")
            namespace = self.shell.user_ns

            def step(batch_size):
                __tracebackhide__ = True  # noqa: F841
                saved = namespace.get("BS", _MISSING)
                namespace["BS"] = batch_size
                try:
                    code.run(namespace)
                finally:
                    if saved is _MISSING:
                        namespace.pop("BS", None)
                    else:
                        namespace["BS"] = saved

            return step, expression.strip(), values_named(code.names, namespace)
        if name is None:
            raise usage_error("%autobatch: name a step callable (%autobatch step) or give `-- EXPR` using BS")
        if name not in self.shell.user_ns:
            raise usage_error(f"%autobatch: {name!r} is not defined")
        step = self.shell.user_ns[name]
        if not callable(step):
            raise usage_error(f"%autobatch: {name!r} is not callable; it should take the batch size")
        return step, name, referenced_values(step)


_MISSING = object()


class _Progress:
    """One status line, updated in place while a search or comparison runs (notebooks only)."""

    def __init__(self, magic: str):
        self.magic = magic
        self.runs = 0
        self.handle = display(self._bundle("starting…"), raw=True, display_id=True)

    def _bundle(self, text: str) -> dict:
        return {"text/plain": f"{self.magic}: {text}"}

    def say(self, text: str) -> None:
        self.handle.update(self._bundle(text), raw=True)

    def probe(self, probe) -> None:
        self.runs += 1
        outcome = (f"peak {probe.peak_bytes / 2**20:.1f} MiB" if probe.ok and probe.peak_bytes is not None
                   else "out of memory")
        self.handle.update(self._bundle(f"run {self.runs}: batch {probe.batch_size} → {outcome}"), raw=True)

    def close(self) -> None:
        self.handle.update({"text/plain": ""}, raw=True)


def parse_argstring(magic, line: str):
    """The magic's options split as a shell splits them (quotes removed: --variants 'eager,amp'),
    with shlex's errors (an unclosed quote) as usage errors, not tracebacks."""
    try:
        return magic.parser.parse_args(arg_split(line, posix=True))
    except ipython_error.UsageError as exc:  # argparse's messages quote the arguments
        raise usage_error(str(exc)) from None
    except ValueError as exc:
        prefix = "%%" if magic.__name__ in ("torchprofile", "amp_compare") else "%"
        raise usage_error(f"{prefix}{magic.__name__}: {exc} in the options: {line.strip()}") from None


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


# Raised from a code object outside the package: IPython always shows a traceback's innermost
# frame, hidden or not, and a frame of ours would say nothing to the user.
_BARE_INTERRUPT = compile("raise KeyboardInterrupt('stopped between runs of your code')", "<interrupted>", "exec")


def _raise_as_shown(interrupt: KeyboardInterrupt):
    """Re-raise a Ctrl-C as the user should see it: where their code was, if it landed there (the
    traceback from their first frame on); else a bare KeyboardInterrupt (it landed in our code:
    between their runs, in a restore)."""
    __tracebackhide__ = True  # noqa: F841
    tb = interrupt.__traceback__
    while tb is not None and _ours(tb):
        tb = tb.tb_next
    if tb is not None:
        _drop_signal_handler_frame(tb)
        # the user's code, unless torchmagic's own frames come again further in (the Ctrl-C landed
        # in code that ours called: a generated dataclass __init__, torch's profiler)
        rest, landed_in_ours = tb, False
        while rest is not None and not landed_in_ours:
            landed_in_ours, rest = _ours(rest), rest.tb_next
        if not landed_in_ours:
            raise interrupt.with_traceback(tb) from None
    try:
        exec(_BARE_INTERRUPT, {})
    except KeyboardInterrupt as bare:
        bare.__suppress_context__ = True
        raise


def _interrupted_line(result) -> str:
    """One line on what an interrupted magic measured before it stopped."""
    if result is None:
        return "interrupted before there was anything to report"
    if isinstance(result, ProfileResult):
        ran, asked = len(result.step_s), result.options.get("steps")
        if ran:
            return f"interrupted: {ran} of {asked} profiled steps ran; the profile below covers them"
        if len(result.warmup_s) < result.options.get("warmup", 0):
            return "interrupted during the warm-up runs, before profiling began"
        return "interrupted before the first profiled step finished: the profile below has no full step"
    if isinstance(result, CompareResult):
        return f"interrupted after {result.rounds} timed rounds: the figures below cover them"
    if isinstance(result, AutobatchResult):
        return result.reason or "interrupted: the trials that ran are below"
    if isinstance(result, LoaderTuneResult):
        return next((n for n in result.notes if n.startswith("interrupted")), "interrupted: what was measured is below")
    if isinstance(result, MemoryResult):
        return "interrupted: the cell's memory up to the interrupt is below"
    return "interrupted: what was measured is below"


def _drop_signal_handler_frame(tb) -> None:
    """The Ctrl-C was raised by torchmagic's SIGINT handler (interrupts.py), called on top of the
    user's frame: end the traceback at the user's frame, where Python's own handler would."""
    while tb.tb_next is not None:
        if tb.tb_next.tb_frame.f_code is signal_handler_code():
            tb.tb_next = None
            return
        tb = tb.tb_next


def _ours(tb) -> bool:
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep)


def _split_expression(line: str) -> tuple[str, str | None]:
    """Options before a lone ``--``, the step's code after it (kept verbatim, quotes and all)."""
    match = re.search(r"(?:^|\s)--(?:\s|$)", line)
    if match is None:
        return line, None
    return line[: match.start()], line[match.end():]


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(TorchMagics)
