"""One rank of ``%%torchprofile --ranks N``: ``python -m torchmagic.features.profile.traces.worker PAYLOAD``.

Started by launch.py with the environment torchrun gives its workers (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT ...).  It joins the process group, loads the variables the
notebook shared, and runs the cell's code once under torch.profiler, with ``prof`` in its
namespace: a loop that calls ``prof.step()`` marks its steps, and the schedule profiles
``warmup`` of them un-recorded, then ``steps``; a cell that never calls it is one window.  The
trace goes to ``<trace_dir>/rank<R>.pt.trace.json``.  If the cell raises, its traceback (the
cell's frames only) goes to stderr and the rank exits with 1.
"""

from __future__ import annotations

import os
import sys
import warnings

from ....core.ranks.rank import (SetupFailed, cell_namespace, compile_cell, exit_rank, join_group, leave_group,
                                read_payload, setup_failed, show_cell_error, stop_with_the_notebook)

CELL_FILENAME = "<%%torchprofile cell>"
EXIT_CELL_FAILED = 1
EXIT_NO_TRACE = 3


def main(payload_path: str) -> int:
    from torch.profiler import ProfilerActivity, profile, schedule

    # without warm-up steps, torch warns that results may be skewed: the user chose --warmup 0
    warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
    stop_with_the_notebook()
    payload = read_payload(payload_path)
    rank = int(os.environ["RANK"])
    backend = payload["backend"]
    join_group(backend)
    try:
        try:
            namespace = cell_namespace(payload["shared"])
        except SetupFailed as exc:
            return setup_failed(exc)
        code = payload["code"]
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if backend == "nccl" else [])
        path = os.path.join(payload["trace_dir"], f"rank{rank}.pt.trace.json")
        stepped = "prof.step" in code
        plan = schedule(wait=0, warmup=payload["warmup"], active=payload["steps"], repeat=1) if stepped else None
        compiled = compile_cell(code, CELL_FILENAME)
        with profile(activities=activities, schedule=plan, record_shapes=payload["record_shapes"],
                     on_trace_ready=(lambda p: p.export_chrome_trace(path)) if stepped else None) as prof:
            namespace["prof"] = prof
            try:
                exec(compiled, namespace)
            except BaseException as exc:
                show_cell_error(exc, CELL_FILENAME)
                return EXIT_CELL_FAILED
        if not stepped:
            prof.export_chrome_trace(path)
        elif prof.step_num < payload["warmup"] + payload["steps"]:  # on this rank at least: refused, not half-read
            if prof.step_num <= payload["warmup"]:
                print(f"the cell called prof.step() {prof.step_num} time(s): too few to reach a profiled step "
                      f"(after {payload['warmup']} warm-up step(s))", file=sys.stderr)
            else:
                print(f"the cell called prof.step() {prof.step_num} time(s) on rank {rank}: too few for "
                      f"{payload['warmup']} warm-up and {payload['steps']} profiled step(s) "
                      f"({payload['warmup'] + payload['steps']} calls)", file=sys.stderr)
            return EXIT_NO_TRACE
        return 0
    finally:
        leave_group()


if __name__ == "__main__":
    exit_rank(main(sys.argv[1]))
