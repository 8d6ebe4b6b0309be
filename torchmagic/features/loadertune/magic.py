"""%loadertune: parse the line, time the DataLoader settings with run_loadertune, show the result."""

from __future__ import annotations

import ast
from dataclasses import replace

from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ...core.expectations import parse_expect, remember
from ...core.ipython import DEVICE_ARGUMENT, TorchMagicsBase, parse_argstring, refused, usage_error, user_frames_only
from ...core.state import referenced_values
from .dataloader import as_loader
from .options import MIN_PAIRED_ROUNDS, LoaderTuneOptions
from .run import objects_to_restore, run_loadertune


@magics_class
class LoaderTuneMagics(TorchMagicsBase):
    @magic_arguments()
    @argument("--workers", metavar="LIST", help="worker counts to try, e.g. 0,1,2,4 (default: 0, powers of two, "
              "and the CPU count)")
    @argument("--batches", type=int, metavar="N", help="batches timed per pass (default: as many as fit in --seconds)")
    @argument("--seconds", type=float, default=0.5, metavar="S", help="seconds timed per pass (default 0.5)")
    @argument("--rounds", type=int, default=MIN_PAIRED_ROUNDS, metavar="N",
              help=f"passes per setting, interleaved (default {MIN_PAIRED_ROUNDS}, the fewest that give a 95%% CI)")
    @argument("--expect", metavar="LOW-HIGH", help="a finding's predicted speedup of the change, e.g. 1.10-1.40: "
              "the report says whether the measurement agrees")
    @argument("--step", metavar="NAME", help="a function taking a batch (a training step): also time it with the "
              "loaders, to tell whether the loader or the model is the bottleneck")
    @DEVICE_ARGUMENT
    @argument("-o", dest="output", metavar="NAME", help="store the LoaderTuneResult in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @argument("loader", help="a DataLoader, or a dataset followed by DataLoader arguments: ds batch_size=64 shuffle=True")
    @argument("loader_kwargs", nargs="*", metavar="KEY=VALUE", help="DataLoader arguments when LOADER is a dataset")
    @line_magic
    @user_frames_only
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
        args = parse_argstring(self.loadertune, line, "%loadertune")
        self.check_output_name(args.output)
        namespace = self.shell.user_ns
        if args.loader not in namespace:
            raise usage_error(f"%loadertune: {args.loader!r} is not defined")
        try:
            workers = tuple(int(w) for w in args.workers.split(",")) if args.workers else None
        except ValueError:
            raise usage_error(f"%loadertune: --workers takes counts such as 0,1,2,4; got {args.workers!r}") from None
        try:
            options = LoaderTuneOptions(workers=workers, batches=args.batches, seconds=args.seconds, rounds=args.rounds,
                                        expect=parse_expect(args.expect) if args.expect is not None else None)
            loader = as_loader(namespace[args.loader], self._loader_kwargs(args.loader_kwargs))
        except ValueError as exc:
            raise refused("%loadertune", exc) from None
        step = None
        if args.step is not None:
            step = namespace.get(args.step)
            if not callable(step):
                raise usage_error(f"%loadertune: --step {args.step!r} is not a function defined in the notebook")
        device = self.device(args.device, referenced_values(step) if step else [], "%loadertune")
        progress = self.progress("%loadertune", args.quiet)
        try:
            run = run_loadertune(loader, replace(options, step=step), state=objects_to_restore(step),
                                 label=args.loader, device=device, on_progress=progress.say if progress else None)
        except KeyboardInterrupt as exc:
            self.interrupted(args, exc)
        finally:
            if progress:
                progress.close()
        # for the profile's dataloader rule: the next profile of a cell iterating this loader reads it
        result = run.result
        if run.error is None and (measured := result.expectation_check
                                  or (result.change.measured() if result.change else None)):
            remember("dataloader", f"loader:{args.loader}", measured)
        return self.line_outcome(args, run)

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
