"""The ranks' processes, started as ``torchrun`` starts its workers and stopped as one."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..interrupts import HeldScope, deliver_pending, uninterruptible
from ..limits import SettingError, usable_cores
from .output import RankOutput

STOP_GRACE_S = 5          # a rank told to stop (SIGTERM) has this long before SIGKILL
POLL_S = 0.05             # how often the ranks' output and exits are looked at while the notebook waits
RANKS_PER_CORE = 4        # CPU ranks beyond this many per usable core only contend
EXIT_SETUP_FAILED = 2     # a rank could not load what was shared with it
CONTROL_ENV = "TORCHMAGIC_CONTROL_FDS"  # "COMMANDS,REPLIES": the rank's ends of its control pipes
JOB_ENV = "TORCHMAGIC_RANKS_JOB"  # the job's folder: every process the ranks start inherits it
LIFELINE_ENV = "TORCHMAGIC_LIFELINE_FD"  # the rank's read end of a pipe only the notebook writes to
SCRATCH_PATH_MAX = 64  # multiprocessing puts sockets in TMPDIR/pymp-*/: a Unix socket's path holds 107 bytes
MAX_WORLD_SIZE = 1 << 17  # ranks x nodes: rank 0 keeps state per peer (~140 bytes each in gloo: 14 GB at 10^8)
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class RankFailed(RuntimeError):
    """A rank exited with an error; its output (above) has the traceback."""

    def __init__(self, rank: int, exitcode: int, last_line: str):
        if exitcode < 0:  # a signal ended it: SIGKILL from outside is most often the out-of-memory killer
            name = signal.Signals(-exitcode).name
            what = f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        else:
            what = last_line or f"exit code {exitcode}"
        super().__init__(f"rank {rank} failed: {what} (its output is above); the other ranks were stopped")
        self.rank, self.exitcode, self.said = rank, exitcode, last_line


def choose_backend(ranks: int, backend: str | None, gpus: int) -> str:
    """NCCL with a GPU per rank, gloo otherwise; a backend asked for must be possible here."""
    if ranks < 1:
        raise SettingError("ranks", f"must be at least 1, got {ranks}")
    if backend not in (None, "gloo", "nccl"):
        raise SettingError("backend", f"must be gloo or nccl, got {backend!r}")
    backend = backend or ("nccl" if gpus >= ranks else "gloo")
    if backend == "nccl" and gpus < ranks:
        raise SettingError("backend", f"nccl needs a GPU per rank: {ranks} ranks, {gpus} GPU(s) here")
    if backend == "gloo" and ranks > RANKS_PER_CORE * usable_cores():
        raise SettingError("ranks", f"{ranks} is more than {RANKS_PER_CORE}x the {usable_cores()} usable "
                                    "cores: each rank is a process with its own copy of the model")
    return backend


def threads_per_rank(ranks: int) -> int:
    return max(1, usable_cores() // ranks)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Node:
    """Where this machine's ranks sit in a job of several machines: torchrun's ``--nnodes``,
    ``--node-rank`` and ``--master-addr``/``--master-port``.  Node 0 runs global rank 0, which
    listens at ``master``; each other node's ranks connect to it."""

    nnodes: int = 1
    node_rank: int = 0
    master: str | None = None  # "HOST:PORT"; None: a free port on this machine (one node)

    def __post_init__(self):
        if self.nnodes < 1:
            raise SettingError("nnodes", f"must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise SettingError("node_rank", f"must be from 0 to nnodes - 1 ({self.nnodes - 1}), got {self.node_rank}")
        if self.nnodes > MAX_WORLD_SIZE:
            raise SettingError("nnodes", f"must be at most {MAX_WORLD_SIZE:,} (ranks x nodes at most that), "
                                         f"got {self.nnodes:,}")
        if self.nnodes > 1 and self.master is None:
            raise SettingError("master", "is needed with nnodes > 1: HOST:PORT of node 0, where rank 0 listens")
        if self.master is not None:
            self.address()

    def address(self) -> tuple[str, int]:
        host, _, port = (self.master or "").rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingError("master", f"must be HOST:PORT (a port from 1 to 65535), got {self.master!r}")
        return host.strip("[]"), int(port)  # [::1]:29500, as torchrun writes an IPv6 address

    def first_rank(self, ranks: int) -> int:
        return self.node_rank * ranks

    def check_world(self, ranks: int) -> None:
        if ranks * self.nnodes > MAX_WORLD_SIZE:
            raise SettingError("nnodes", f"times --ranks must be at most {MAX_WORLD_SIZE:,} ranks in all, got "
                                         f"{self.nnodes:,} x {ranks:,}")


def rank_environment(local_rank: int, ranks: int, node: Node, host: str, port: int, threads: int) -> dict[str, str]:
    """What torchrun sets for each worker (and the package on the path): ``ranks`` on this node."""
    path = os.environ.get("PYTHONPATH")
    rank, world = node.first_rank(ranks) + local_rank, ranks * node.nnodes
    return {
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "GROUP_RANK": str(node.node_rank),
        "ROLE_RANK": str(rank), "ROLE_NAME": "default", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(ranks),
        "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": host, "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": "torchmagic", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads)),
        "PYTHONPATH": _PACKAGE_ROOT + (os.pathsep + path if path else ""),
        "PYTHONUNBUFFERED": "1",
    }


class RankProcesses(HeldScope):
    """The ranks, started and stopped as one: a Ctrl-C while they start, restart or stop is held
    until every one is stopped and the temporary directory is gone.

    Each rank is started as torch's elastic agent starts a worker (its ``SubprocessHandler``: a
    ``Popen`` in a session of its own, stopped with ``killpg``, SIGTERM then SIGKILL), with
    torchrun's environment, running ``python -m MODULE PAYLOAD``.  Not through ``start_processes``
    itself: it replaces the caller's SIGINT, SIGTERM, SIGHUP and SIGQUIT handlers, and a notebook's
    must stay as they are.  With ``control``, each rank also gets two pipes (control.py)."""

    def __init__(self, module: str, payload: Callable[[str], bytes], ranks: int, threads: int,
                 control: bool = False, node: Node = Node()):
        """``payload(out_dir)``: what each rank reads (the code, shared variables, options); ``out_dir``
        is where ranks write files for the notebook, in the job's temporary folder."""
        node.check_world(ranks)
        self.module, self.payload, self.ranks, self.threads = module, payload, ranks, threads
        self.control, self.node = control, node
        self.processes: list[subprocess.Popen] = []
        self.logs: list[tuple[int, str, bool]] = []    # (rank, path, is stderr), every start's
        self.channels: list[tuple[int, int]] = []      # per rank: (commands fd to write, replies fd to read)
        self.lifeline: int | None = None               # the write end: it closes when the notebook's process ends
        self.workdir: str | None = None
        self.scratch: str | None = None
        self.out_dir = ""
        self.starts = 0
        self._stopped = False

    def acquire(self) -> RankProcesses:
        try:
            self.workdir = tempfile.mkdtemp(prefix="torchmagic-ranks-")
            self.out_dir = os.path.join(self.workdir, "out")
            os.makedirs(self.out_dir)
            self.scratch = os.path.join(self.workdir, "tmp")  # the ranks' TMPDIR: DataLoader's pymp-*, torch's own
            if len(self.scratch) > SCRATCH_PATH_MAX and os.path.isdir("/tmp"):
                self.scratch = tempfile.mkdtemp(prefix="torchmagic-", dir="/tmp")
            else:
                os.makedirs(self.scratch)
            self._payload_path = os.path.join(self.workdir, "payload.pkl")
            with open(self._payload_path, "wb") as f:
                f.write(self.payload(self.out_dir))
            self._start()
        except BaseException:  # a rank that could not start: the ones that did are stopped
            self.release()
            raise
        return self

    def _start(self) -> None:
        host, port = self.node.address() if self.node.master else ("127.0.0.1", _free_port())
        self.starts += 1
        # Only this process holds the write end, so the ranks' read ends see EOF however it ends (an
        # out-of-memory kill included): each rank then stops its own process group (rank.py).
        lifeline, self.lifeline = os.pipe()
        try:
            self._start_ranks(host, port, lifeline)
        finally:
            _close_all((lifeline,))  # the ranks have their copies (or never started)

    def _start_ranks(self, host: str, port: int, lifeline: int) -> None:
        for rank in range(self.ranks):
            suffix = "" if self.starts == 1 else f".{self.starts}"
            out, err = (os.path.join(self.workdir, f"rank{rank}{suffix}.{name}") for name in ("out", "err"))
            shown_as = self.node.first_rank(self.ranks) + rank  # the job's rank, as RANK says
            self.logs += [(shown_as, out, False), (shown_as, err, True)]
            env = {**os.environ, **rank_environment(rank, self.ranks, self.node, host, port, self.threads)}
            env.update(TMPDIR=self.scratch, TMP=self.scratch, TEMP=self.scratch,
                       **{JOB_ENV: self.workdir, LIFELINE_ENV: str(lifeline)})
            theirs: tuple[int, ...] = ()
            if self.control:
                commands, replies = os.pipe(), os.pipe()
                self.channels.append((commands[1], replies[0]))  # ours, closed on stop
                theirs = (commands[0], replies[1])
                env[CONTROL_ENV] = f"{commands[0]},{replies[1]}"
            try:
                with open(out, "wb") as stdout, open(err, "wb") as stderr:
                    self.processes.append(subprocess.Popen(
                        [sys.executable, "-m", self.module, self._payload_path], env=env,
                        pass_fds=(*theirs, lifeline), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                        start_new_session=True))
            finally:
                _close_all(theirs)  # the rank has its copies (or never started)

    def failed(self) -> tuple[int, int] | None:
        """(rank in the job, exit code) of a rank that ended with an error, if one has."""
        for rank, process in enumerate(self.processes):
            code = process.poll()
            if code not in (None, 0):
                return self.node.first_rank(self.ranks) + rank, code
        return None

    def running(self) -> bool:
        return any(process.poll() is None for process in self.processes)

    @uninterruptible
    def restart(self) -> None:
        """Stop every rank and start them all again, from the cell (with new log files)."""
        self.stop()
        self.processes, self._stopped = [], False
        self._start()
        deliver_pending()

    def stop(self) -> None:
        """Stop every rank and its DataLoader workers (its process group), and any process a rank
        started in a session of its own (found by the job's mark in its environment): SIGTERM, then
        SIGKILL after the grace period.  Once; the output files stay until release."""
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
        while self._escaped() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        self._signal(signal.SIGKILL)
        for process in self.processes:
            process.wait()
        _wait_gone(self._escaped(), STOP_GRACE_S)
        for fds in self.channels:
            for fd in fds:
                os.close(fd)
        self.channels = []
        if self.lifeline is not None:
            os.close(self.lifeline)
            self.lifeline = None

    def release(self) -> None:
        try:
            self.stop()
        finally:
            for folder in (self.workdir, self.scratch):
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)

    def _signal(self, sig: signal.Signals) -> None:
        for process in self.processes:
            try:
                os.killpg(process.pid, sig)
            except (ProcessLookupError, PermissionError):  # the group is gone: nothing left of it
                pass
        for pid in self._escaped():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _escaped(self) -> list[int]:
        """Live processes (not zombies) carrying this job's mark: ranks' helpers wherever they went."""
        if self.workdir is None or not os.path.isdir("/proc"):
            return []
        mark = f"\0{JOB_ENV}={self.workdir}\0".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    marked = mark in b"\0" + f.read() + b"\0"
                if marked and _alive(int(entry)):
                    found.append(int(entry))
            except OSError:  # gone, or not ours to read
                continue
        return found


@uninterruptible
def _close_all(fds: tuple[int, ...]) -> None:
    for fd in fds:
        os.close(fd)
    deliver_pending()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _wait_gone(pids: list[int], seconds: float) -> None:
    """Processes not ours to wait for (their parent is init now): until each is gone or a zombie."""
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def failure_error(ranks: RankProcesses, output: RankOutput, failure: tuple[int, int]) -> Exception:
    """The error to raise for a rank that failed: the others are stopped first, and what they
    all wrote up to there is shown."""
    ranks.stop()
    output.poll(final=True)
    rank, code = failure
    said = output.last_error_line.get(rank, "")
    if code == EXIT_SETUP_FAILED:
        return SettingError("share", said or "the ranks could not load it")
    return RankFailed(rank, code, said)
