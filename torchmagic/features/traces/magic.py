"""%torchprofile --load PATH: analyse traces written elsewhere (the line form of %%torchprofile)."""

from __future__ import annotations

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ...core.ipython import TorchMagicsBase, parse_argstring, usage_error, user_frames_only
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
        %%torchprofile [options]        (a cell magic) profile the cell below: see %%torchprofile?

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
        return self.line_outcome(args, result)
