"""The rank's side: join the process group, load what the notebook shared, run the cell, and
when the cell fails show its frames only (not torchmagic's, nor torch's below them)."""

from __future__ import annotations

import builtins
import gc
import linecache
import os
import pickle
import signal
import sys
import threading
import traceback
from typing import Any, NoReturn

from .processes import EXIT_SETUP_FAILED, LIFELINE_ENV


class SetupFailed(Exception):
    """What the notebook shared could not be loaded here; the message says why."""


def stop_with_the_notebook() -> None:
    """End this rank, and every process of its group (DataLoader workers), when the notebook's process
    ends without stopping it (killed, out of memory): the lifeline's write end, held by the notebook
    only, closes then, and a read of this end returns nothing."""
    fd = os.environ.pop(LIFELINE_ENV, None)  # not for the processes this rank starts
    if fd is None:
        return

    def watch() -> None:
        while True:
            try:
                if not os.read(int(fd), 1):
                    break
            except InterruptedError:
                continue
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="torchmagic-lifeline", daemon=True).start()


def read_payload(path: str) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


def join_group(backend: str):
    """Join the process group as a torchrun worker does; the rank's device (its own GPU with
    NCCL, made current; else the CPU)."""
    import torch.distributed as dist

    from ..devices import rank_device

    device = rank_device(backend, int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    return device


def leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """End the rank's process once it has left the group, without the interpreter's teardown: a gloo
    rank that ran ops after its profiler's schedule ended sometimes aborts there ("terminate called
    without an active exception", SIGABRT; 2 exits in 16 of a torchrun job of 2 ranks, none with
    os._exit).  What the cell built (DataLoader workers) is freed first; the launcher stops the rank's
    process group after it anyway."""
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cell_namespace(blob: bytes) -> dict[str, Any]:
    """A fresh ``__main__`` namespace holding the shared variables."""
    try:
        shared = {name: pickle.loads(value) for name, value in pickle.loads(blob).items()}
    except Exception as exc:  # a class or function the notebook defined: not in this process
        raise SetupFailed(f"rank {os.environ.get('RANK')} could not load the shared variables: "
                          f"{type(exc).__name__}: {exc}") from None
    return {"__name__": "__main__", "__builtins__": builtins, **shared}


def compile_cell(code: str, filename: str):
    """The cell compiled under ``filename``, its lines where tracebacks look for them."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    return compile(code, filename, "exec")


def show_cell_error(exc: BaseException, *filenames: str) -> None:
    """The exception on stderr with the cell's frames only (those from ``filenames``)."""
    shown = traceback.TracebackException.from_exception(exc)
    shown.stack = traceback.StackSummary.from_list([f for f in shown.stack if f.filename in filenames])
    sys.stderr.write("".join(shown.format()))


def setup_failed(exc: SetupFailed) -> int:
    print(exc, file=sys.stderr)
    return EXIT_SETUP_FAILED
