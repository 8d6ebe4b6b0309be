"""%%amp_compare: parse the line, run the cell under each variant with run_compare, show the
CompareResult; the cell's variables are left as eager's first run left them."""

from __future__ import annotations

from argparse import SUPPRESS
from dataclasses import replace

from IPython.core.magic import cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ...core.devices.profiler import ProfilerBusyError
from ...core.expectations import code_key, parse_expect
from ...core.ipython import (DEVICE_ARGUMENT, Notice, TorchMagicsBase, parse_argstring, refused, usage_error,
                             user_frames_only)
from ...core.shell import is_internal
from ...core.state import values_named
from .options import CompareOptions
from .repeated import compared_again
from .run import Workload, advance_notes, objects_to_restore, run_compare
from .summary import remember_measured
from .variants import DEFAULT_VARIANTS, TECHNIQUES, parse_variants


@magics_class
class CompareMagics(TorchMagicsBase):
    @magic_arguments(name="%amp_compare")  # the usage line reads %%amp_compare: IPython writes one % before it
    @argument("--model", metavar="NAME",
              help="the nn.Module the cell uses; each variant's version stands in for it while the cell runs "
                   "(default: the one module with parameters that the cell names)")
    @argument("--variants", default=DEFAULT_VARIANTS, metavar="LIST",
              help=f"comma-separated, eager always included (default {DEFAULT_VARIANTS}); techniques: "
                   + ", ".join(TECHNIQUES) + "; combine with +, e.g. compile+amp")
    @argument("--runs", type=int, metavar="N", help="timed rounds (default: at least 10, until --min-time; a 95%% CI needs 6)")
    @argument("--min-time", type=float, default=1.0, metavar="S",
              help="seconds of timed runs per variant (default 1)")
    @argument("--warmup", type=int, default=3, metavar="N", help="untimed runs per variant after its first (default 3)")
    @argument("--dtype", metavar="DTYPE", help="autocast dtype for amp: bf16 or fp16 "
              "(default: bf16 where the device has it, else fp16)")
    @argument("--accuracy-of", dest="compared", metavar="NAME",
              help="the variable holding the cell's output whose error against eager is measured "
                   "(default: the cell's last expression)")
    @argument("--output", dest="compared_old_flag", metavar="NAME", help=SUPPRESS)  # --accuracy-of's old name
    @argument("--atol", type=float, metavar="X", help="absolute tolerance of the numerics check")
    @argument("--rtol", type=float, metavar="X",
              help="relative tolerance, times the largest |eager output| (default by precision: fp32 1e-4, "
                   "tf32 5e-3, fp16 1e-2, bf16 5e-2, int8 0.1)")
    @argument("--expect", metavar="LOW-HIGH",
              help="a finding's predicted speedup of the one variant besides eager, e.g. 1.15-1.30: the report "
                   "says whether the measurement agrees")
    @argument("--no-restore", action="store_true",
              help="do not snapshot and restore the model and optimizer (saves host memory; the runs train them)")
    @DEVICE_ARGUMENT
    @argument("-o", dest="output", metavar="NAME", help="store the CompareResult in variable NAME")
    @argument("-q", dest="quiet", action="store_true", help="show nothing (use with -o)")
    @cell_magic
    @user_frames_only
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
        args, options, flag_notes = self._options(line)
        code = self.compile_cell(cell, "%%amp_compare")
        after_eager: dict = {}  # the cell's variables as eager's first run left them
        workload, state, device = self._workload(args, code, after_eager)
        # before anything runs: e.g. amp on a CPU without native bf16 is measured anyway (the report says it too)
        notice = Notice(advance_notes(options, device)) if not args.quiet else None
        progress = self.progress("%%amp_compare", args.quiet)
        try:
            run = run_compare(workload, options, state=state, device=device, label="%%amp_compare",
                              on_progress=progress.say if progress else None)
        except ProfilerBusyError as exc:
            raise usage_error(f"%%amp_compare: {exc}") from None
        except KeyboardInterrupt as exc:  # held while something was put back, raised as the run ended
            self.interrupted(args, exc)
        finally:
            if progress:
                progress.close()
            if notice:
                notice.close()
        self._after_run(run, after_eager, cell, flag_notes, workload.model)
        return self.cell_outcome(args, run)

    def _options(self, line: str):
        """The parsed line, the CompareOptions it asks for, and the report's notes on its flags."""
        args = parse_argstring(self.amp_compare, line, "%%amp_compare")
        self.check_output_name(args.output)
        flag_notes = _old_flag_names(args)
        try:
            options = CompareOptions(
                variants=tuple(parse_variants(args.variants)), runs=args.runs, min_time=args.min_time,
                warmup=args.warmup, dtype=args.dtype.lower() if args.dtype else None, atol=args.atol,
                rtol=args.rtol, restore=not args.no_restore,
                expect=parse_expect(args.expect) if args.expect is not None else None)
        except ValueError as exc:
            raise refused("%%amp_compare", exc) from None
        return args, options, flag_notes

    def _workload(self, args, code, after_eager: dict):
        """The cell as run_compare runs it (each variant's model under the model's name, the
        --accuracy-of variable compared), what it restores, and the device: checked before anything runs."""
        namespace = self.shell.user_ns
        name = self._model_name(args.model, code.names)
        model = namespace[name] if name else None
        state = objects_to_restore(model, values_named(code.names, namespace), namespace)
        device = self.device(args.device, [model, *values_named(code.names, namespace)], "%%amp_compare")

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
            raise usage_error(f"%%amp_compare: --accuracy-of needs a variable name, got {compared!r}")

        def output(value):
            if compared is None:
                return value
            if compared not in namespace:
                raise usage_error(f"%%amp_compare: the cell did not define {compared!r} (--accuracy-of)")
            return namespace[compared]

        workload = Workload(run_cell, model, output, after_baseline=lambda: after_eager.update(namespace))
        return workload, state, device

    def _after_run(self, run, after_eager: dict, cell: str, flag_notes: list[str], model) -> None:
        """What an ended run leaves: its cleanup notes printed, the cell's variables as eager's first run
        left them, the measured speedups kept for the next profile of this cell, the notes on the
        line's flags first in the report, and a note where an interval misses the one this cell's last run gave."""
        if run.result is not None and flag_notes:
            run.result = replace(run.result, notes=[*flag_notes, *run.result.notes])
        if isinstance(run.error, KeyboardInterrupt):  # what was cleaned up: one line each, however it is shown
            for note in getattr(run.error, "__notes__", ()):
                print(note)
            run.error.__notes__ = []
        if after_eager:  # the variables as eager's first run left them, not as the last variant did
            # (internal names stay: removing dynamo's helper globals would make it recompile)
            namespace = self.shell.user_ns
            for key in [k for k in namespace if k not in after_eager and not is_internal(k)]:
                del namespace[key]
            namespace.update(after_eager)
        if run.result is not None and run.error is None:  # for the profile rules: the next profile of this cell
            remember_measured(run.result, code_key(cell))
            run.result.notes.extend(compared_again(run.result, code_key(cell), model))

    def _model_name(self, name: str | None, names: set[str]) -> str | None:
        """The variable holding the model the variants change: --model, else the one module with
        parameters that the cell names."""
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


def _old_flag_names(args) -> list[str]:
    """--output NAME, --accuracy-of's name until it clashed with -o NAME (which stores the result, as
    in every magic): still taken, with a note in the report, until it is removed."""
    if args.compared_old_flag is None:
        return []
    if args.compared is not None:
        raise usage_error("%%amp_compare: --output is now --accuracy-of; give only --accuracy-of")
    args.compared = args.compared_old_flag
    return ["--output is now --accuracy-of (it will be removed)"]
