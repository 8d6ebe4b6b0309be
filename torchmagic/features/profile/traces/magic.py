"""%torchprofile --load PATH: analyse traces written elsewhere (the line form of %%torchprofile);
and %%torchprofile --ranks N, the cell magic's multi-process form (ProfileMagics hands it over)."""

from __future__ import annotations

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ....core.devices import nccl_gpus
from ....core.ipython import TorchMagicsBase, parse_argstring, raise_as_shown, refused, usage_error, user_frames_only
from ....core.limits import SettingError
from ....core.outcome import Outcome
from ....core.ranks import Node, RankFailed
from .launch import RanksOptions, run_ranks
from .reader import TraceFileError
from .run import analyze_traces


@magics_class
class TracesMagics(TorchMagicsBase):
    @magic_arguments(name="torchprofile")  # the method is torchprofile_load: %%torchprofile is ProfileMagics'
    @argument("--load", metavar="PATH", help="a trace JSON (.json or .json.gz), a directory of per-rank traces "
              "(as tensorboard_trace_handler writes them), or several files separated by commas")
    @argument("-o", dest="output", metavar="NAME", help="store the TraceAnalysis in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @line_magic("torchprofile")
    @user_frames_only
    def torchprofile_load(self, line):
        """Analyse the traces a job wrote: per rank, and across ranks.

        %torchprofile --load PATH       PATH: a trace, or a directory of one trace per rank
        %%torchprofile [options]        (the cell magic) profile the cell below: its options are above

        Per rank, seconds per step: compute, data loading, communication (and how much of it is
        exposed), waiting for other ranks against transfer; the straggler the others wait for and
        what it does longer; findings with fixes.  Files are read as streams, in bounded memory.
        Returns the TraceAnalysis (`r = %torchprofile --load DIR` keeps it); with -q returns nothing.
        The Python twin is torchmagic.analyze(PATH).
        """
        __tracebackhide__ = True  # noqa: F841
        if not any(word == "--load" or word.startswith("--load=") for word in line.split()):
            raise usage_error("%torchprofile: the line form loads traces (%torchprofile --load PATH); to profile "
                              "code, put %%torchprofile on the first line of its cell")
        args = parse_argstring(self.torchprofile_load, line, "%torchprofile")
        self.check_output_name(args.output)
        paths = [part.strip() for part in args.load.split(",") if part.strip()]
        try:
            result = analyze_traces(paths[0] if len(paths) == 1 else paths)
        except TraceFileError as exc:
            raise usage_error(f"%torchprofile --load: {exc}") from None
        return self.line_outcome(args, Outcome(result))


MAGIC = "%%torchprofile"
_SINGLE_PROCESS_ONLY = ("memory", "stack", "flops", "diff", "capture_budget",  # the ranks' profilers are not budgeted
                        "verify", "expect")


def ranks_magic(magics, args, cell: str):
    """Run the cell on ``args.ranks`` processes and show the cross-rank report."""
    __tracebackhide__ = True  # noqa: F841
    magics.check_output_name(args.output)
    unsupported = [f"--{name.replace('_', '-')}" for name in _SINGLE_PROCESS_ONLY
                   if getattr(args, name) not in (None, False)]  # a bare --verify is ""
    if unsupported or args.device is not None:
        flags = ", ".join(unsupported + (["--device"] if args.device is not None else []))
        raise usage_error(f"{MAGIC}: {flags} cannot go with --ranks (each rank uses its own device: "
                          "cuda:LOCAL_RANK with nccl, the CPU with gloo)")
    try:
        options = RanksOptions(ranks=args.ranks, backend=args.backend, steps=args.steps, warmup=args.warmup,
                               record_shapes=args.record_shapes, trace_dir=args.trace,
                               trace_overwrite=args.trace_overwrite, node=Node(args.nnodes, args.node_rank, args.master))
    except ValueError as exc:
        raise refused(MAGIC, exc) from None
    shared = magics.shared_values(args.share, MAGIC)
    magics.compile_cell(cell, MAGIC)  # a syntax error shows as IPython shows one, and nothing runs
    code = magics.shell.transform_cell(cell)
    error = None
    try:
        result = run_ranks(code, shared, options, gpus=nccl_gpus(), label=MAGIC)
    except SettingError as exc:
        error = refused(MAGIC, exc)
    except (RankFailed, TraceFileError) as exc:
        error = usage_error(f"{MAGIC}: {exc}")
    except KeyboardInterrupt as exc:
        print("interrupted: every rank was stopped before the traces were compared; nothing was analysed")
        raise_as_shown(exc)
    if error is not None:  # raised outside the except, this frame without the shared values: IPython keeps
        del shared         # the traceback, and the user's objects (an open socket) must not live on in it
        raise error
    magics.keep_and_show(args, result)
    return None
