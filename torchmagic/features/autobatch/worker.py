"""One rank of ``%%autobatch --ranks N``: ``python -m torchmagic.features.autobatch.worker PAYLOAD``.

Started by ranks.py with the environment torchrun gives its workers.  It joins the process group,
loads the variables the notebook shared, runs the cell once (it builds the model, wraps it in
DistributedDataParallel, defines the step), then does what the notebook asks, one request at a
time over its control pipes: run the step at a batch size and say its peak, say its memory budget,
time the step.  The step's own errors, other than running out of memory, show the cell's frames
and end the rank with 1.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from ...core.ranks.control import reply, requests
from ...core.ranks.rank import (SetupFailed, cell_namespace, compile_cell, exit_rank, join_group, leave_group,
                                read_payload, setup_failed, show_cell_error, stop_with_the_notebook)
from ...core.state import Snapshot
from .footprint import FOOTPRINT_RUNS, FootprintCount
from .run import objects_to_restore, resolve_budget
from .search import SearchSpace
from .trial import THROUGHPUT_REPEATS, measure_throughput, run_first_trial, run_trial, starting_over

CELL_FILENAME = "<%%autobatch cell>"
STEP_FILENAME = "<%%autobatch step>"
EXIT_STEP_FAILED = 1
EXIT_NO_STEP = 3
_MISSING = object()


def main(payload_path: str) -> int:
    stop_with_the_notebook()
    payload = read_payload(payload_path)
    device = join_group(payload["backend"])
    try:
        try:
            namespace = cell_namespace(payload["shared"])
        except SetupFailed as exc:
            return setup_failed(exc)
        try:
            exec(compile_cell(payload["code"], CELL_FILENAME), namespace)
        except BaseException as exc:
            show_cell_error(exc, CELL_FILENAME, STEP_FILENAME)
            return EXIT_STEP_FAILED
        step = _step(payload, namespace)
        if step is None:
            return EXIT_NO_STEP
        reset = starting_over(Snapshot(objects_to_restore(step), device), device)  # each trial from here
        for request in requests():
            try:
                reply(_answer(request, step, device, reset))
            except BaseException as exc:
                show_cell_error(exc, CELL_FILENAME, STEP_FILENAME)
                return EXIT_STEP_FAILED
        return 0
    finally:
        leave_group()


def _step(payload: dict, namespace: dict):
    """The callable the cell defined, or the ``-- EXPR`` step with BS set; None (said why) if neither."""
    if payload["expression"] is not None:
        code = compile_cell(payload["expression"], STEP_FILENAME)

        def step(batch_size):
            namespace["BS"] = batch_size
            exec(code, namespace)

        return step
    name = payload["step"]
    step = namespace.get(name, _MISSING)
    if step is _MISSING or not callable(step):
        print(f"the cell {'did not define' if step is _MISSING else 'defined a value that is not callable as'} "
              f"{name!r}: it should define {name}(batch_size), which builds a batch and runs one step",
              file=sys.stderr)
        return None
    return step


def _answer(request: dict, step, device, reset) -> dict:
    rank = int(os.environ["RANK"])
    if request["do"] == "probe":
        if request.get("fresh"):  # this process ran no step yet: its first steps are read (the notebook pools them)
            return {"rank": rank, **dataclasses.asdict(run_first_trial(step, request["size"], device, reset))}
        # every rank runs the same steps (a collective in the step waits for all): a fixed number of reads
        footprint = FootprintCount(runs=(FOOTPRINT_RUNS[0],) * 2)
        return {"rank": rank, **dataclasses.asdict(run_trial(step, request["size"], device, reset, footprint))}
    if request["do"] == "budget":
        budget, how = resolve_budget(request["budget"], device)
        sharing = int(os.environ["LOCAL_WORLD_SIZE"])
        if request["budget"] is not None and request["budget"] > 1:
            how += ", for each rank"
        elif not device.is_accelerator and sharing > 1:
            budget //= sharing  # the ranks on a machine share its RAM; a GPU is each rank's own
            how += f", shared by the {sharing} ranks on this machine"
        return {"rank": rank, "bytes": budget, "how": how, "device": device.describe().to_dict(),
                "notes": [note for note in (device.choice_note(),) if note], "accelerator": device.is_accelerator}
    if request["do"] == "throughput":
        points = measure_throughput(step, request["answer"], SearchSpace(*request["space"]), device)
        return {"rank": rank, "repeats": THROUGHPUT_REPEATS,
                "points": [[p.batch_size, p.seconds_per_step] for p in points]}
    raise ValueError(f"unknown request {request!r}")


if __name__ == "__main__":
    exit_rank(main(sys.argv[1]))
