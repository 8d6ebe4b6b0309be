"""``%%torchprofile --ranks N``: the cell's code in N processes, as ``torchrun`` runs a script.

The ranks (core/ranks) run worker.py; their output is shown live, each line prefixed
``[rank R]``.  When one rank fails the others are stopped; on a Ctrl-C, or any error here, every
rank (and its DataLoader workers, in its process group) is stopped before the magic returns, and
the temporary files go.  The traces they wrote are then compared by analyze_traces.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ....core.interrupts import guards
from ....core.limits import SettingError, check_count, describe_error
from ....core.ranks import Node, RankOutput, RankProcesses, choose_backend, failure_error, pickle_shared
from ....core.ranks.output import show_rank_line
from ....core.ranks.processes import POLL_S, threads_per_rank
from ....core.ranks.share import shared_note
from ....core.user_files import check_new_file, publish_copy
from .result import TraceAnalysis
from .run import analyze_traces
from .worker import EXIT_NO_TRACE

WORKER = "torchmagic.features.profile.traces.worker"


@dataclass(frozen=True)
class RanksOptions:
    ranks: int
    backend: str | None = None       # None: nccl when every rank has a GPU of its own, else gloo
    steps: int = 1
    warmup: int = 0
    record_shapes: bool = False
    trace_dir: str | None = None     # keep the per-rank traces here (else a temporary directory)
    node: Node = Node()              # with several machines: this one's place (torchrun's --nnodes ...)
    trace_overwrite: bool = False    # replace rank files already in trace_dir (else refused)

    def __post_init__(self):
        choose_backend(self.ranks, self.backend, gpus=self.ranks)  # the values; the GPUs are checked at run
        if self.steps < 1:
            raise SettingError("steps", f"must be at least 1, got {self.steps}")
        if self.warmup < 0:
            raise SettingError("warmup", f"must be 0 or more, got {self.warmup}")
        check_count("steps", self.steps)
        check_count("warmup", self.warmup)
        self.node.check_world(self.ranks)
        if self.trace_dir is not None:
            check_trace_folder(self.trace_dir)
            for path in self.kept_traces() if os.path.isdir(self.trace_dir) else ():
                check_new_file("trace", path, self.trace_overwrite)

    def kept_traces(self) -> list[str]:
        """Where this node's ranks' traces are kept: ``trace_dir/rank<R>.pt.trace.json``."""
        return [os.path.join(self.trace_dir, trace_name(r)) for r in _ranks(self)]


def trace_name(rank: int) -> str:
    return f"rank{rank}.pt.trace.json"


def check_trace_folder(folder: str) -> None:
    """--trace with --ranks names a folder: one that exists, or one to make in a folder that does."""
    if os.path.lexists(folder):
        if not os.path.isdir(folder):
            raise SettingError("trace", f"with --ranks names a folder for the ranks' traces: {folder!r} is not one")
    else:
        check_new_file("trace", folder, overwrite=False)  # its parent: there, writable, not the kernel's


@guards
def run_ranks(code: str, shared: dict[str, Any], options: RanksOptions, *, gpus: int = 0,
              on_output: Callable[[int, str, bool], None] | None = None, label: str = "ranks") -> TraceAnalysis:
    """Run ``code`` on ``options.ranks`` processes, each profiled; their traces compared."""
    __tracebackhide__ = True  # noqa: F841
    backend = choose_backend(options.ranks, options.backend, gpus)
    blob = pickle_shared(shared)

    def payload(out_dir: str) -> bytes:
        return pickle.dumps({"code": code, "shared": blob, "backend": backend, "steps": options.steps,
                             "warmup": options.warmup, "record_shapes": options.record_shapes,
                             "trace_dir": out_dir})

    threads = threads_per_rank(options.ranks)
    started = time.perf_counter()
    with RankProcesses(WORKER, payload, options.ranks, threads, node=options.node) as ranks:
        output = RankOutput(ranks.logs, on_output or show_rank_line)
        while ranks.running() and ranks.failed() is None:
            time.sleep(POLL_S)
            output.poll()
        failure = ranks.failed()
        if failure is not None:
            error = failure_error(ranks, output, failure)
            if failure[1] == EXIT_NO_TRACE:
                raise SettingError("warmup", f"and --steps: {output.last_error_line.get(failure[0], '')}")
            raise error
        output.poll(final=True)
        first = options.node.first_rank(options.ranks)
        written = [os.path.join(ranks.out_dir, trace_name(r)) for r in _ranks(options)]
        result = analyze_traces(written, label=label)
        kept = _keep_traces(written, options)
    seconds = time.perf_counter() - started
    where = (f" of node {options.node.node_rank} (ranks {first} to {first + options.ranks - 1} of "
             f"{options.ranks * options.node.nnodes}; the other nodes' traces are theirs: torchmagic.analyze "
             "on a directory of every rank's compares them all)" if options.node.nnodes > 1 else "")
    ran = (f"ran on {options.ranks} rank(s){where} with {backend}, {threads} thread(s) each, in {seconds:.1f} s; "
           f"{shared_note(shared, blob)}")
    return dataclasses.replace(result, notes=[ran, *result.notes, *kept])


def _keep_traces(written: list[str], options: RanksOptions) -> list[str]:
    """The ranks' traces put in --trace's folder only once the job is done, each file whole; what
    could not be kept is said (the analysis stands)."""
    if options.trace_dir is None:
        return []
    try:
        os.makedirs(options.trace_dir, exist_ok=True)
        for source, kept in zip(written, options.kept_traces()):
            publish_copy(source, kept, options.trace_overwrite)
    except OSError as exc:
        return [f"Could not keep the ranks' traces in {options.trace_dir}: {describe_error(exc)}"]
    return [f"The ranks' traces are in {options.trace_dir}: {', '.join(map(trace_name, _ranks(options)))}"]


def _ranks(options: RanksOptions) -> range:
    first = options.node.first_rank(options.ranks)
    return range(first, first + options.ranks)
