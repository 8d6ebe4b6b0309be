"""%%torchprofile: parse the line, profile the cell with run_profile, show the ProfileResult."""

from __future__ import annotations

import os
from dataclasses import replace

from IPython.core.magic import cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ...core.devices.profiler import ProfilerBusyError
from ...core.ipython import (BACKEND_ARGUMENT, DEVICE_ARGUMENT, SHARE_ARGUMENT, TorchMagicsBase, parse_argstring,
                             refused, run_from_button, share_help, usage_error, user_frames_only)
from ...core.limits import parse_budget_text, usable_cores
from ...core.render import live
from ...core.render.saved import NotAResultFile
from ...core.render.saved import load as load_saved
from ...core.state import names_used, values_named
from .budget import CaptureBudgetError
from .diff import diff_profiles, profile_in, step_problem
from .options import SORT_KEYS, ProfileOptions
from .result import ProfileResult
from .traces.magic import TracesMagics, ranks_magic
from .run import measured_nothing, run_profile
from .user import user_setup
from .verify_cells import VerifyCells


@magics_class
class ProfileMagics(TorchMagicsBase):
    @magic_arguments(name="%torchprofile")  # the usage line reads %%torchprofile: IPython writes one % before it
    @argument("--steps", type=int, default=1, metavar="N",
              help="profile N runs of the cell, each marked as a step (default 1)")
    @argument("--warmup", type=int, default=0, metavar="N",
              help="run the cell N times un-profiled first; with N >= 2 the profiler's overhead is measured")
    @argument("--capture-budget", metavar="SIZE", help="host memory the profile may take, its events included once "
              "the profiler stops: bytes (2GiB, 512MiB) or a fraction of the available memory (default 0.5); the "
              "steps stop before one that would pass it, with a note")
    @argument("--record-shapes", action="store_true", help="show operators' input shapes")
    @argument("--memory", action="store_true", help="record allocations: peak memory, bytes per operator, the "
              "memory timeline and the largest allocations alive at the peak with the code that made them")
    @argument("--stack", action="store_true",
              help="trace Python calls to rank your functions by the op time they call (slower)")
    @argument("--flops", action="store_true", help="estimate FLOPs and place each heavy operator on the roofline "
              "of this machine's measured peaks")
    @argument("--trace", metavar="PATH", help="write a Chrome trace JSON (open it in ui.perfetto.dev); with "
              "--ranks, a folder for one trace per rank. A file already there is not replaced")
    @argument("--trace-overwrite", action="store_true", help="with --trace: replace the file(s) already there")
    @argument("--sort", default="auto", metavar="KEY",
              help="order operators by: auto (GPU time when present, else CPU), "
                   + ", ".join(sorted(set(SORT_KEYS))))
    @argument("--top", type=int, default=15, metavar="K", help="operators shown (default 15)")
    @argument("--diff", metavar="NAME", help="also show what changed against the profile stored in NAME "
              "(-o NAME on an earlier run) or saved in a file (a path: r.save(PATH), from any process): the step "
              "time's ratio with its confidence interval, operators, findings")
    @argument("--verify", nargs="?", const="", metavar="NAME", help="time this cell, with a finding's fix, against "
              "the cell profiled into NAME (-o NAME; alone: the last profiled cell) in interleaved rounds, each from "
              "the same state, and judge the speedup against --expect: within, above, below or inconclusive")
    @argument("--expect", metavar="LOW-HIGH", help="with --verify: the finding's predicted speedup, e.g. 1.00-1.27")
    @argument("--ranks", type=int, metavar="N", help="run the cell in N processes with torch.distributed set up "
              "(as torchrun runs a script), each profiled, and compare the ranks; the cell's loop calls prof.step()")
    @BACKEND_ARGUMENT
    @SHARE_ARGUMENT
    @argument("--nnodes", type=int, default=1, metavar="M", help="with --ranks: the job spans M machines, each "
              "running this cell on N ranks (as torchrun --nnodes); world size N*M")
    @argument("--node-rank", type=int, default=0, metavar="K", help="with --nnodes: this machine's place, 0 to M-1 "
              "(node 0 runs rank 0)")
    @argument("--master", metavar="HOST:PORT", help="with --nnodes: node 0's address and a free port there, where "
              "rank 0 listens (as torchrun --master-addr/--master-port)")
    @DEVICE_ARGUMENT
    @argument("-o", dest="output", metavar="NAME", help="store the ProfileResult in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @cell_magic
    @user_frames_only
    def torchprofile(self, line, cell):
        """Profile the cell with torch.profiler and say what took the time and what to do about it.

        The cell runs as usual: its variables stay defined and its last expression is
        returned.  The report shows findings (bottleneck, fix, command to verify it), time by
        category, the top operators and a timeline.  If the cell raises, the profile of
        what ran is shown and the exception re-raised; the exception alone if none of the
        cell's work was measured (a typo on its first line).

        With --ranks N the cell is a distributed program: it runs once in each of N processes
        (the process group set up, gloo on CPU, NCCL with a GPU per rank), its loop marking
        steps with prof.step(); --warmup and --steps choose the profiled ones.  Output is shown
        live per rank; the report compares the ranks (the straggler, waiting, communication).

        The line magic %torchprofile --load PATH analyses traces a job wrote elsewhere: its
        options are at the end.
        """
        __tracebackhide__ = True  # noqa: F841
        args = parse_argstring(self.torchprofile, line, "%%torchprofile")
        if args.trace_overwrite and args.trace is None:
            raise usage_error("%%torchprofile: --trace-overwrite goes with --trace PATH")
        if args.ranks is not None:
            return ranks_magic(self, args, cell)
        if args.backend is not None or args.share is not None or args.nnodes != 1 or args.node_rank != 0 \
                or args.master is not None:
            raise usage_error("%%torchprofile: --backend, --share, --nnodes, --node-rank and --master go with "
                              "--ranks N")
        options = _profile_options(args)
        self.check_output_name(args.output)
        before = self._diff_base(args.diff)
        verify = VerifyCells.checked(self, args)  # --verify NAME: the profile whose cell this one is timed against
        code = self.compile_cell(cell, "%%torchprofile")
        namespace = self.shell.user_ns
        device = self.device(args.device, values_named(code.names, namespace), "%%torchprofile")
        verified = verify.run(code, cell, device) if verify is not None else None  # before this cell's profile runs

        def step():
            __tracebackhide__ = True  # noqa: F841
            return code.run(namespace)

        try:
            run = run_profile(step, options, label="%%torchprofile", device=device, code=cell,
                              user=replace(user_setup(names_used(code.names, namespace), usable_cores()),
                                           profile=args.output))
        except (ProfilerBusyError, CaptureBudgetError) as exc:
            raise usage_error(f"%%torchprofile: {exc}") from None
        except KeyboardInterrupt as exc:  # held while the profiler stopped, raised as the run ended
            self.interrupted(args, exc)
        if isinstance(run.error, Exception) and measured_nothing(run.result):
            raise run.error  # the user's own error before any of the cell's work was measured: shown alone
        live.set_runner(run.result, self._verify_runner(cell))  # for its buttons, not on it
        changed = (diff_profiles(before, run.result, (args.diff, args.output or f"this cell (In [{self._running_cell_number()}])"))
                   if before is not None and run.result.step_s else None)
        run.result.verified = verified
        VerifyCells.keep_last(self, run.result, args)
        return self.cell_outcome(args, run, also=[r for r in (changed, verified) if r is not None])

    def _diff_base(self, name: str | None) -> ProfileResult | None:
        """The profile --diff NAME compares with, checked before anything runs."""
        if name is None:
            return None
        if not name.isidentifier():  # a path: a profile (or a one-rank trace's analysis) saved with r.save(PATH)
            try:
                value = load_saved(os.path.expanduser(name))
            except NotAResultFile as exc:
                raise usage_error(f"%%torchprofile: --diff {exc}") from None
        elif name in self.shell.user_ns:
            value = self.shell.user_ns[name]
        else:
            raise usage_error(f"%%torchprofile: --diff {name}: not defined, not a profile with a step to compare "
                              f"{_HOW_TO_KEEP_A_PROFILE}")
        base = profile_in(value)
        if base is None:
            raise usage_error(f"%%torchprofile: --diff {name}: a value of type {type(value).__name__}, not a profile "
                              f"with a step to compare {_HOW_TO_KEEP_A_PROFILE}")
        problem = step_problem(base)
        if problem is not None:
            raise usage_error(f"%%torchprofile: --diff {name}: {problem}"
                              + (f" {_HOW_TO_KEEP_A_PROFILE}" if not base.step_s else ""))
        return base

    def _verify_runner(self, cell: str):
        """Runs a finding's verify command from the report's button: a cell magic on top of the
        profiled cell's code (%%torchprofile --verify against ``result``, the profile that found it),
        a line magic as it is.  It holds the cell, not the result: it is kept for as long as the
        result lives, which a reference from it would make for ever."""
        def run(result: ProfileResult, command: str):
            if command.startswith("%%torchprofile"):
                self.shell.user_ns[VERIFY_BASE] = result
                command = VerifyCells.against(command, VERIFY_BASE)
            with run_from_button():
                return self.shell.run_cell(f"{command}\n{cell}" if command.startswith("%%") else command,
                                           store_history=False)

        return run


def _profile_options(args) -> ProfileOptions:
    """The profile the line asks for, its --trace path checked: a bad value is refused in one line."""
    try:
        options = ProfileOptions(steps=args.steps, warmup=args.warmup, record_shapes=args.record_shapes,
                                 memory=args.memory, stack=args.stack, flops=args.flops,
                                 trace=args.trace, trace_overwrite=args.trace_overwrite, sort=args.sort,
                                 top=args.top, capture_budget=(parse_budget_text("capture_budget", args.capture_budget)
                                                               if args.capture_budget is not None else None))
        options.check_files()
    except ValueError as exc:
        raise refused("%%torchprofile", exc) from None
    return options


share_help(ProfileMagics.torchprofile, TracesMagics.torchprofile_load,
           "The line magic %torchprofile --load PATH, for traces a job wrote elsewhere")

_HOW_TO_KEEP_A_PROFILE = "(store one with %%torchprofile -o NAME, or save one with NAME.save(PATH))"
VERIFY_BASE = "_torchprofile_before"  # where a verify button keeps the profile its --verify runs against
