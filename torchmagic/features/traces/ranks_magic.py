"""%%torchprofile --ranks N: the cell magic's multi-process form (ProfileMagics hands it over)."""

from __future__ import annotations

from ...core.devices import nccl_gpus
from ...core.ipython import raise_as_shown, refused, usage_error
from ...core.limits import SettingError
from .launch import RankFailed, RanksOptions, run_ranks

MAGIC = "%%torchprofile"
_SINGLE_PROCESS_ONLY = ("memory", "stack", "flops")


def ranks_magic(magics, args, cell: str):
    """Run the cell on ``args.ranks`` processes and show the cross-rank report."""
    __tracebackhide__ = True  # noqa: F841
    magics.check_output_name(args.output)
    unsupported = [f"--{name}" for name in _SINGLE_PROCESS_ONLY if getattr(args, name)]
    if unsupported or args.device is not None:
        flags = ", ".join(unsupported + (["--device"] if args.device is not None else []))
        raise usage_error(f"{MAGIC}: {flags} cannot go with --ranks (each rank uses its own device: "
                          "cuda:LOCAL_RANK with nccl, the CPU with gloo)")
    try:
        options = RanksOptions(ranks=args.ranks, backend=args.backend, steps=args.steps, warmup=args.warmup,
                               record_shapes=args.record_shapes, trace_dir=args.trace)
    except ValueError as exc:
        raise refused(MAGIC, exc) from None
    namespace = magics.shell.user_ns
    names = [n.strip() for n in (args.share or "").split(",") if n.strip()]
    missing = [n for n in names if n not in namespace]
    if missing:
        raise usage_error(f"{MAGIC}: --share {', '.join(map(repr, missing))}: not defined in the notebook")
    magics.compile_cell(cell, MAGIC)  # a syntax error shows as IPython shows one, and nothing runs
    code = magics.shell.transform_cell(cell)
    try:
        result = run_ranks(code, {n: namespace[n] for n in names}, options, gpus=nccl_gpus(), label=MAGIC)
    except SettingError as exc:
        raise refused(MAGIC, exc) from None
    except RankFailed as exc:
        raise usage_error(f"{MAGIC}: {exc}") from None
    except KeyboardInterrupt as exc:
        print("interrupted: every rank was stopped before the traces were compared; nothing was analysed")
        raise_as_shown(exc)
    magics.keep_and_show(args, result)
    return None
