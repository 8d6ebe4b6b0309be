"""%autobatch: parse the line (a step's name, or `-- EXPR` with BS), search with run_autobatch,
show the AutobatchResult.  %%autobatch --ranks N: the cell builds a data-parallel job's rank and
the search runs on every rank (run_autobatch_ranks)."""

from __future__ import annotations

import re

from IPython.core.magic import line_cell_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments

from ...core.devices import nccl_gpus
from ...core.devices.profiler import ProfilerBusyError
from ...core.ipython import (BACKEND_ARGUMENT, DEVICE_ARGUMENT, SHARE_ARGUMENT, TorchMagicsBase, parse_argstring,
                             refused, usage_error, user_frames_only)
from ...core.limits import SettingError, parse_budget_text
from ...core.ranks import RankFailed
from ...core.state import referenced_values, values_named
from .ranks import RankJob, RanksUnsteady, StepMissing, run_autobatch_ranks
from .options import AutobatchOptions
from .run import objects_to_restore, run_autobatch

_MISSING = object()


def parse_budget(text: str, magic: str = "%autobatch") -> float:
    """'8GiB', '512MB', '2e9' (bytes) or '0.9' (a fraction of memory): limits.parse_budget_text."""
    try:
        return parse_budget_text("budget", text)
    except SettingError as exc:
        raise usage_error(f"{magic}: {exc.as_flag()}") from None


@magics_class
class AutobatchMagics(TorchMagicsBase):
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
    @DEVICE_ARGUMENT
    @argument("--ranks", type=int, metavar="N", help="(cell form) run the cell in N processes with torch.distributed "
              "set up, as torchrun runs a script; every rank runs each trial: a size fits if it fits on all")
    @argument("--fresh", action="store_true", help="(cell form) read each trial in processes started for it, "
              "the cell building the model there: what a script's first steps take (on CPU, glibc's heap "
              "and the libraries' first-use memory as new); one process unless --ranks N")
    @BACKEND_ARGUMENT
    @SHARE_ARGUMENT
    @argument("-o", dest="output", metavar="NAME", help="store the AutobatchResult in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @argument("step", nargs="?", help="a callable taking the batch size; or write `-- EXPR` with BS in it")
    @no_var_expand  # the line holds code: "{n}" and $name are the step's, not IPython's to fill in
    @line_cell_magic
    @user_frames_only
    def autobatch(self, line, cell=None):
        """Find the largest batch size that runs without running out of memory.

        %autobatch [options] step          step(batch_size) builds a batch and runs one step
        %autobatch [options] -- EXPR       EXPR uses BS, e.g. model(torch.randn(BS, 3, 64, 64)).sum().backward()
        %%autobatch --ranks N [options] step     (a cell) the cell runs in each of N processes with
                                           the process group set up: it wraps the model in
                                           DistributedDataParallel and defines step(batch_size)
        %%autobatch --fresh [options] step       (a cell) the cell builds the model and defines the
                                           step in a new process for each read of a trial

        Peak memory is fitted against batch size from small runs, the largest size under the
        budget is predicted, and real runs verify it: the answer always ran.  The modules and
        optimizers the step uses are restored afterwards, so probing does not train the model.
        A step that holds more memory after every call (a leak: a list it appends tensors to)
        stops the search where that is seen, and the report says where, how much, and what to fix.
        With --ranks every rank runs each trial: the answer is the per-rank batch size that fits
        on every rank (and the global batch, times N); a rank that runs out of memory has every
        rank started again from the cell, since a data-parallel step that failed part-way leaves
        the others waiting in a collective.  With --fresh each read of a trial is of the first steps
        of processes started for it, as a script (or torchrun) runs them: on CPU a process's first
        steps take memory a warmed notebook kernel took long ago, and glibc's heap starts new.
        Returns the AutobatchResult (`r = %autobatch step` keeps it); with -q returns nothing.
        """
        __tracebackhide__ = True  # noqa: F841
        magic = "%autobatch" if cell is None else "%%autobatch"
        options_text, expression = _split_expression(line)
        args = parse_argstring(self.autobatch, options_text, magic)
        self.check_output_name(args.output)
        _check_form(args, cell)
        try:
            options = AutobatchOptions(
                budget=parse_budget(args.budget, magic) if args.budget is not None else None,
                min=args.min, max=args.max, multiple_of=args.multiple_of, margin=args.margin,
                target_batch=args.target_batch, throughput=args.throughput, estimate=not args.no_estimate,
                fresh=args.fresh)
        except ValueError as exc:
            raise refused(magic, exc) from None
        if cell is not None:
            return self._ranks(args, options, cell, expression)
        step, label, values = self._step(args.step, expression)
        state = objects_to_restore(step, values)
        device = self.device(args.device, values, "%autobatch")
        progress = self.progress("%autobatch", args.quiet)
        try:
            run = run_autobatch(step, options, state=state, device=device, label=label,
                                on_probe=progress.probe if progress else None)
        except ProfilerBusyError as exc:
            raise usage_error(f"%autobatch: {exc}") from None
        except KeyboardInterrupt as exc:
            self.interrupted(args, exc)
        finally:
            if progress:
                progress.close()
        return self.line_outcome(args, run)

    def _ranks(self, args, options: AutobatchOptions, cell: str, expression: str | None):
        """%%autobatch --ranks N (or --fresh, one rank): the cell builds each rank, and every rank runs
        each trial."""
        __tracebackhide__ = True  # noqa: F841
        magic = "%%autobatch"
        if args.device is not None:
            raise usage_error(f"{magic}: --device cannot go with --ranks (each rank uses its own device: "
                              "cuda:LOCAL_RANK with nccl, the CPU with gloo)")
        if (args.step is None) == (expression is None):
            raise usage_error(f"{magic}: name the step the cell defines (%%autobatch --ranks N step) or give "
                              "`-- EXPR` using BS" + (", not both" if args.step else ""))
        if expression is not None and not re.search(r"\bBS\b", expression):
            raise usage_error(f"{magic}: the expression after -- must use BS for the batch size")
        if args.step is not None and not args.step.isidentifier():
            raise usage_error(f"{magic}: {args.step!r} is not a name the cell could define")
        shared = self.shared_values(args.share, magic)
        self.compile_cell(cell, magic)  # a syntax error shows as IPython shows one, and nothing runs
        if expression is not None:
            expression = expression.strip()  # plain Python: the ranks have no IPython (nor its names)
            try:
                compile(expression, "<%%autobatch step>", "exec")
            except SyntaxError as exc:
                raise usage_error(f"{magic}: the expression after -- is not Python: {exc.msg}") from None
        progress, error = self.progress(magic, args.quiet), None
        try:
            job = RankJob(self.shell.transform_cell(cell), ranks=1 if args.ranks is None else args.ranks,
                          step=args.step, expression=expression, shared=shared, backend=args.backend,
                          gpus=nccl_gpus())
            run = run_autobatch_ranks(job, options, on_probe=progress.probe if progress else None,
                                      label=args.step or expression)
        except SettingError as exc:
            error = refused(magic, exc)
        except (RankFailed, RanksUnsteady, StepMissing) as exc:
            error = usage_error(f"{magic}: {exc}")
        except KeyboardInterrupt as exc:
            self.interrupted(args, exc)
        finally:
            if progress:
                progress.close()
        if error is not None:  # outside the except, without the shared values: IPython keeps the traceback
            del shared
            raise error
        if run.error is not None:
            self.interrupted(args, run.error, run.result)
        self.keep_and_show(args, run.result)
        return None

    def _step(self, name: str | None, expression: str | None):
        """The step to search with, its label, and the values it uses (to choose the device)."""
        if expression is not None:
            if name is not None:
                raise usage_error("%autobatch: give a step callable or `-- EXPR`, not both")
            if not re.search(r"\bBS\b", expression):
                raise usage_error("%autobatch: the expression after -- must use BS for the batch size")
            code = self.compile_cell(expression, "%autobatch")
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


def _check_form(args, cell: str | None) -> None:
    """The line form runs here; the cell form in processes (--ranks N, --fresh): flags of one, not the other."""
    if cell is None and (args.ranks is not None or args.fresh):
        flag = "--ranks N" if args.ranks is not None else "--fresh"
        raise usage_error(f"%autobatch: {flag} needs the cell form: %%autobatch {flag} step, with a cell "
                          "that builds the model and defines step(batch_size)")
    if cell is not None and args.ranks is None and not args.fresh:
        raise usage_error("%%autobatch: the cell form runs the cell on --ranks N processes, or in a process "
                          "started for each read with --fresh; in this process, run the cell, then %autobatch step")
    if cell is None and (args.backend is not None or args.share is not None):
        raise usage_error("%autobatch: --backend and --share go with --ranks N (the cell form)")


def _split_expression(line: str) -> tuple[str, str | None]:
    """Options before a lone ``--``, the step's code after it (kept verbatim, quotes and all)."""
    match = re.search(r"(?:^|\s)--(?:\s|$)", line)
    if match is None:
        return line, None
    return line[: match.start()], line[match.end():]
