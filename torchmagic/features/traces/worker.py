"""One rank of ``%%torchprofile --ranks N``: ``python -m torchmagic.features.traces.worker PAYLOAD``.

Started by launch.py with the environment torchrun gives its workers (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT ...).  It joins the process group, loads the variables the
notebook shared, and runs the cell's code once under torch.profiler, with ``prof`` in its
namespace: a loop that calls ``prof.step()`` marks its steps, and the schedule profiles
``warmup`` of them un-recorded, then ``steps``; a cell that never calls it is one window.  The
trace goes to ``<trace_dir>/rank<R>.pt.trace.json``.  If the cell raises, its traceback (the
cell's frames only) goes to stderr and the rank exits with 1.
"""

from __future__ import annotations

import builtins
import linecache
import os
import pickle
import sys
import traceback
import warnings

CELL_FILENAME = "<%%torchprofile cell>"
EXIT_CELL_FAILED = 1
EXIT_SETUP_FAILED = 2
EXIT_NO_TRACE = 3


def _cell_traceback(exc: BaseException) -> str:
    """The exception with the cell's frames only (not this module's, nor torch's below them)."""
    shown = traceback.TracebackException.from_exception(exc)
    frames = [f for f in shown.stack if f.filename == CELL_FILENAME]
    shown.stack = traceback.StackSummary.from_list(frames)
    return "".join(shown.format())


def main(payload_path: str) -> int:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    # without warm-up steps, torch warns that results may be skewed: the user chose --warmup 0
    warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
    with open(payload_path, "rb") as f:
        payload = pickle.load(f)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    backend = payload["backend"]
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend)
    try:
        try:
            shared = {name: pickle.loads(value) for name, value in pickle.loads(payload["shared"]).items()}
        except Exception as exc:  # a class or function the notebook defined: not in this process
            print(f"rank {rank} could not load the shared variables: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_SETUP_FAILED
        code = payload["code"]
        linecache.cache[CELL_FILENAME] = (len(code), None, code.splitlines(True), CELL_FILENAME)
        namespace = {"__name__": "__main__", "__builtins__": builtins, **shared}
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if backend == "nccl" else [])
        path = os.path.join(payload["trace_dir"], f"rank{rank}.pt.trace.json")
        stepped = "prof.step" in code
        plan = schedule(wait=0, warmup=payload["warmup"], active=payload["steps"], repeat=1) if stepped else None
        compiled = compile(code, CELL_FILENAME, "exec")
        with profile(activities=activities, schedule=plan, record_shapes=payload["record_shapes"],
                     on_trace_ready=(lambda p: p.export_chrome_trace(path)) if stepped else None) as prof:
            namespace["prof"] = prof
            try:
                exec(compiled, namespace)
            except BaseException as exc:
                sys.stderr.write(_cell_traceback(exc))
                return EXIT_CELL_FAILED
        if not stepped:
            prof.export_chrome_trace(path)
        elif not os.path.exists(path):  # the loop ended before a profiled step did
            print(f"the cell called prof.step() {prof.step_num} time(s): too few to reach a profiled step "
                  f"(after {payload['warmup']} warm-up step(s))", file=sys.stderr)
            return EXIT_NO_TRACE
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
