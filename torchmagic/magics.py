"""IPython glue only: parse arguments, call the engine, display the result."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from .cell import Cell
from .engines.profile import ProfileOptions, ProfilerBusyError, run_profile
from .results.profile import SORT_KEYS


@magics_class
class TorchMagics(Magics):
    @staticmethod
    def _check_output_name(name: str | None) -> None:
        """Checked before anything runs, so a typo in -o costs nothing."""
        if name is not None and not name.isidentifier():
            raise UsageError(f"-o needs a Python variable name, got {name!r}")

    def _cell(self, source: str, magic: str) -> Cell:
        if not source.strip():
            raise UsageError(f"%%{magic}: the cell is empty; put the code to measure below the magic line")
        shell = self.shell
        try:
            return Cell(source, transform=shell.transform_cell,
                        register_source=lambda code: shell.compile.cache(code, shell.execution_count,
                                                                         raw_code=source))
        except SyntaxError:
            # Show it as IPython shows a cell's syntax error (the line and a caret, none of our
            # frames), then stop here with one line, so "Run all" stops too.
            shell.showsyntaxerror()
            raise UsageError(f"%%{magic}: the cell has a syntax error (above); nothing ran") from None

    @magic_arguments()
    @argument("--steps", type=int, default=1, metavar="N",
              help="profile N runs of the cell, each marked as a step (default 1)")
    @argument("--warmup", type=int, default=0, metavar="N",
              help="run the cell N times un-profiled first; with N >= 2 the profiler's overhead is measured")
    @argument("--record-shapes", action="store_true", help="show operators' input shapes")
    @argument("--memory", action="store_true", help="record allocations: peak memory and bytes per operator")
    @argument("--stack", action="store_true",
              help="trace Python calls to rank source lines by the op time they cause (slower)")
    @argument("--flops", action="store_true", help="estimate FLOPs of matmuls and convolutions")
    @argument("--trace", metavar="PATH", help="write a Chrome trace JSON (open it in ui.perfetto.dev)")
    @argument("--sort", default="auto", metavar="KEY",
              help="order operators by: auto (GPU time when present, else CPU), "
                   + ", ".join(sorted(set(SORT_KEYS))))
    @argument("--top", type=int, default=15, metavar="K", help="operators shown (default 15)")
    @argument("-o", dest="output", metavar="NAME", help="store the ProfileResult in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @cell_magic
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
            raise UsageError(f"%%torchprofile: {exc}") from None
        self._check_output_name(args.output)
        code = self._cell(cell, "torchprofile")
        namespace = self.shell.user_ns

        def step():
            __tracebackhide__ = True  # noqa: F841
            return code.run(namespace)

        try:
            run = run_profile(step, options, label="%%torchprofile")
        except ProfilerBusyError as exc:
            raise UsageError(f"%%torchprofile: {exc}") from None
        if args.output is not None:
            self.shell.user_ns[args.output] = run.result
        if not args.quiet:
            display(run.result)
        if run.error is not None:
            raise run.error
        return run.value


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(TorchMagics)
