"""``%%torchprofile --ranks N``: the cell's code in N processes, as ``torchrun`` runs a script.

Each rank is a process started as torch's elastic agent starts a worker (RankProcesses), with the
environment torchrun gives its workers, running worker.py.  Their output goes to files that are
followed here and shown live, each line prefixed ``[rank R]``.  When one rank fails the others are
stopped; on a Ctrl-C, or any error here, every rank (and its DataLoader workers, in its process
group) is stopped before the magic returns, and the temporary files go.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.devices.profiler import is_profiler_banner
from ...core.interrupts import HeldScope, guards
from ...core.limits import SettingError, check_count, usable_cores
from .result import TraceAnalysis
from .run import analyze_traces
from .worker import EXIT_NO_TRACE, EXIT_SETUP_FAILED

STOP_GRACE_S = 5          # a rank told to stop (SIGTERM) has this long before SIGKILL
POLL_S = 0.05             # how often the ranks' output and exits are looked at
RANKS_PER_CORE = 4        # CPU ranks beyond this many per usable core only contend
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # torchmagic/


class RankFailed(RuntimeError):
    """A rank exited with an error; its output (above) has the traceback."""

    def __init__(self, rank: int, exitcode: int, last_line: str):
        if exitcode < 0:  # a signal ended it: SIGKILL from outside is most often the out-of-memory killer
            name = signal.Signals(-exitcode).name
            what = f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        else:
            what = last_line or f"exit code {exitcode}"
        super().__init__(f"rank {rank} failed: {what} (its output is above); the other ranks were stopped")
        self.rank, self.exitcode = rank, exitcode


@dataclass(frozen=True)
class RanksOptions:
    ranks: int
    backend: str | None = None       # None: nccl when every rank has a GPU of its own, else gloo
    steps: int = 1
    warmup: int = 0
    record_shapes: bool = False
    trace_dir: str | None = None     # keep the per-rank traces here (else a temporary directory)

    def __post_init__(self):
        if self.ranks < 1:
            raise SettingError("ranks", f"must be at least 1, got {self.ranks}")
        if self.backend not in (None, "gloo", "nccl"):
            raise SettingError("backend", f"must be gloo or nccl, got {self.backend!r}")
        if self.steps < 1:
            raise SettingError("steps", f"must be at least 1, got {self.steps}")
        if self.warmup < 0:
            raise SettingError("warmup", f"must be 0 or more, got {self.warmup}")
        check_count("steps", self.steps)
        check_count("warmup", self.warmup)


def choose_backend(options: RanksOptions, gpus: int) -> str:
    """NCCL with a GPU per rank, gloo otherwise; a backend asked for must be possible here."""
    backend = options.backend or ("nccl" if gpus >= options.ranks else "gloo")
    if backend == "nccl" and gpus < options.ranks:
        raise SettingError("backend", f"nccl needs a GPU per rank: {options.ranks} ranks, {gpus} GPU(s) here")
    if backend == "gloo" and options.ranks > RANKS_PER_CORE * usable_cores():
        raise SettingError("ranks", f"{options.ranks} is more than {RANKS_PER_CORE}x the {usable_cores()} usable "
                                    "cores: each rank is a process with its own copy of the model")
    return backend


def pickle_shared(shared: dict[str, Any]) -> bytes:
    """The shared variables, each pickled once (a rank loads each back with ``pickle.loads``);
    refused in one line when a rank could not load one: classes and functions the notebook
    defined are pickled by name, and do not exist in a rank."""
    found: list[str] = []

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            module = getattr(obj, "__module__", None) if isinstance(obj, type) or callable(obj) else None
            if module == "__main__" and getattr(obj, "__qualname__", None):
                found.append(obj.__qualname__)
            return None

    pickled = {}
    for name, value in shared.items():
        found.clear()
        buffer = io.BytesIO()
        try:
            _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        except Exception as exc:
            if not found:
                raise SettingError("share", f"{name}: cannot be sent to the ranks ({type(exc).__name__}: {exc})") from None
        if found:
            raise SettingError("share", f"{name}: uses {', '.join(sorted(set(found)))}, defined in the notebook, "
                                        "which the ranks do not have: define it in the cell, or in a module")
        pickled[name] = buffer.getvalue()
    return pickle.dumps(pickled, protocol=pickle.HIGHEST_PROTOCOL)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(rank: int, world: int, port: int, threads: int) -> dict[str, str]:
    """What torchrun sets for each worker on a single node (and the package on the path)."""
    package_root = os.path.dirname(_PACKAGE_DIR)
    path = os.environ.get("PYTHONPATH")
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
        "ROLE_NAME": "default", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
        "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": "torchmagic", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads)),
        "PYTHONPATH": package_root + (os.pathsep + path if path else ""),
        "PYTHONUNBUFFERED": "1",
    }


class RankProcesses(HeldScope):
    """The ranks, started and stopped as one: a Ctrl-C while they start or stop is held until
    every one is stopped and the temporary directory is gone.

    Each rank is started as torch's elastic agent starts a worker (its ``SubprocessHandler``: a
    ``Popen`` in a session of its own, stopped with ``killpg``, SIGTERM then SIGKILL), with
    torchrun's environment.  Not through ``start_processes`` itself: it replaces the caller's
    SIGINT, SIGTERM, SIGHUP and SIGQUIT handlers, and a notebook's must stay as they are."""

    def __init__(self, payload: Callable[[str], bytes], ranks: int, threads: int, keep_traces: str | None):
        """``payload(trace_dir)``: what each rank reads (the code, shared variables, options)."""
        self.payload, self.ranks, self.threads, self.keep_traces = payload, ranks, threads, keep_traces
        self.processes: list[subprocess.Popen] = []
        self.logs: list[tuple[int, str, bool]] = []   # (rank, path, is stderr)
        self.workdir: str | None = None
        self.trace_dir = ""
        self._stopped = False

    def acquire(self) -> RankProcesses:
        try:
            return self._start()
        except BaseException:  # a rank that could not start: the ones that did are stopped
            self.release()
            raise

    def _start(self) -> RankProcesses:
        self.workdir = tempfile.mkdtemp(prefix="torchmagic-ranks-")
        self.trace_dir = self.keep_traces or os.path.join(self.workdir, "traces")
        os.makedirs(self.trace_dir, exist_ok=True)
        payload_path = os.path.join(self.workdir, "payload.pkl")
        with open(payload_path, "wb") as f:
            f.write(self.payload(self.trace_dir))
        port = _free_port()
        for rank in range(self.ranks):
            out, err = (os.path.join(self.workdir, f"rank{rank}.{name}") for name in ("out", "err"))
            self.logs += [(rank, out, False), (rank, err, True)]
            with open(out, "wb") as stdout, open(err, "wb") as stderr:
                self.processes.append(subprocess.Popen(
                    [sys.executable, "-m", "torchmagic.features.traces.worker", payload_path],
                    env={**os.environ, **rank_environment(rank, self.ranks, port, self.threads)},
                    stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True))
        return self

    def failed(self) -> tuple[int, int] | None:
        """(rank, exit code) of a rank that ended with an error, if one has."""
        for rank, process in enumerate(self.processes):
            code = process.poll()
            if code not in (None, 0):
                return rank, code
        return None

    def running(self) -> bool:
        return any(process.poll() is None for process in self.processes)

    def stop(self) -> None:
        """Stop every rank and its DataLoader workers (its process group): SIGTERM, then SIGKILL
        after the grace period.  Once; the output files stay until release."""
        if self._stopped:
            return
        self._stopped = True
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in self.processes:
            try:
                process.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        self._signal(signal.SIGKILL)
        for process in self.processes:
            process.wait()

    def release(self) -> None:
        try:
            self.stop()
        finally:
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _signal(self, sig: signal.Signals) -> None:
        for process in self.processes:
            try:
                os.killpg(process.pid, sig)
            except (ProcessLookupError, PermissionError):  # the group is gone: nothing left of it
                pass


class _Follower:
    """The ranks' output files, read as they grow: each complete line handed on with its rank."""

    def __init__(self, logs: list[tuple[int, str, bool]], on_output: Callable[[int, str, bool], None]):
        self.logs = logs
        self.offsets = {path: 0 for _, path, _ in logs}
        self.partial = {path: "" for _, path, _ in logs}
        self.on_output = on_output
        self.last_error_line: dict[int, str] = {}

    def poll(self, final: bool = False) -> None:
        for rank, path, is_err in self.logs:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(self.offsets[path])
                    text = f.read()
                    self.offsets[path] = f.tell()
            except FileNotFoundError:
                continue
            lines = (self.partial[path] + text).split("\n")
            self.partial[path] = "" if final else lines.pop()
            for line in lines if not final else [x for x in lines if x]:
                if is_profiler_banner(line):
                    continue
                self.on_output(rank, line, is_err)
                if is_err and line.strip():
                    self.last_error_line[rank] = line.strip()


@guards
def run_ranks(code: str, shared: dict[str, Any], options: RanksOptions, *, gpus: int = 0,
              on_output: Callable[[int, str, bool], None] | None = None, label: str = "ranks") -> TraceAnalysis:
    """Run ``code`` on ``options.ranks`` processes, each profiled; their traces compared."""
    __tracebackhide__ = True  # noqa: F841
    backend = choose_backend(options, gpus)
    blob = pickle_shared(shared)

    def payload(trace_dir: str) -> bytes:
        return pickle.dumps({"code": code, "shared": blob, "backend": backend, "steps": options.steps,
                             "warmup": options.warmup, "record_shapes": options.record_shapes,
                             "trace_dir": trace_dir})

    threads = max(1, usable_cores() // options.ranks)
    show = on_output or (lambda rank, line, is_err: print(f"[rank {rank}] {line}",
                                                            file=sys.stderr if is_err else sys.stdout))
    started = time.perf_counter()
    with RankProcesses(payload, options.ranks, threads, options.trace_dir) as ranks:
        follower = _Follower(ranks.logs, show)
        failure = None
        while failure is None and ranks.running():
            time.sleep(POLL_S)
            follower.poll()
            failure = ranks.failed()
        failure = failure or ranks.failed()
        if failure is not None:
            ranks.stop()  # the others now: their output up to here is shown, then the failure
        follower.poll(final=True)
        if failure is not None:
            rank, code = failure
            said = follower.last_error_line.get(rank, "")
            if code == EXIT_SETUP_FAILED:
                raise SettingError("share", said or "the ranks could not load it")
            if code == EXIT_NO_TRACE:
                raise SettingError("warmup", f"and --steps: {said}")
            raise RankFailed(rank, code, said)
        # the files this run wrote, not others a kept --trace directory may hold
        result = analyze_traces([os.path.join(ranks.trace_dir, f"rank{r}.pt.trace.json") for r in range(options.ranks)],
                                label=label)
    result.notes.insert(0, _launch_note(options, backend, threads, shared, blob, time.perf_counter() - started))
    return result


def _launch_note(options: RanksOptions, backend: str, threads: int, shared: dict, blob: bytes, seconds: float) -> str:
    what = (f"shared with each rank (pickled, {len(blob) / 2**20:.1f} MiB): {', '.join(sorted(shared))}"
            if shared else "nothing shared from the notebook (--share NAME,... to send variables)")
    return (f"ran on {options.ranks} rank(s) with {backend}, {threads} thread(s) each, in {seconds:.1f} s; {what}")
