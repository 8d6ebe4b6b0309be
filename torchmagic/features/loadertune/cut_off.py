"""What a Ctrl-C holds when it cuts off torch's DataLoader while a batch crosses from a worker.

A worker sends a batch's tensors as shared memory: the main process asks the worker's resource
sharer for the memory's file descriptor over a socket.  An interrupt inside that exchange leaves the
socket's connection in the frames of the traceback, which IPython keeps (seen in real SIGINTs on a
CNN's loader, benchmarks/real_interrupts.py).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import socket

import torch

from ...core.interrupts import uninterruptible

# Where a batch or its socket can sit in a finished frame: torch (its loader, its unpickling of shared
# storages in torch.multiprocessing.reductions and torch._utils, seen holding a batch after real SIGINTs),
# multiprocessing's exchange with a worker, the socket module's methods, and this package's own passes
# over a loader (a batch in a local).
_LOADER_CODE = (*(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, multiprocessing)),
                os.path.abspath(socket.__file__), os.path.dirname(os.path.abspath(__file__)) + os.sep)


def release_loader_frames(exc: BaseException) -> None:
    """Free the locals of the finished loader, multiprocessing and socket frames in ``exc``'s traceback
    (a batch's shared memory, a half-open socket to a worker); they still show, and the user's are left."""
    tb = exc.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_LOADER_CODE):
            try:
                tb.tb_frame.clear()
            except RuntimeError:  # still executing
                pass
        tb = tb.tb_next


# torch's shared memory as /proc shows it: its file-descriptor strategy names its /dev/shm files
# torch_<pid>_... and unlinks them at once (" (deleted)").  Only those: a user's own are never ours.
_SHARED_MEMORY = "/dev/shm/torch_"


def shared_memory_fds() -> set[int]:
    """The process's open file descriptors on torch's shared memory (Linux; empty elsewhere)."""
    found = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith(_SHARED_MEMORY):
                found.add(int(name))
        except (OSError, ValueError):  # closed meanwhile (listdir's own descriptor among them)
            pass
    return found


def mapped_inodes() -> set[int] | None:
    """The inodes of the files the process maps (/proc/self/maps), or None where it cannot be read."""
    try:
        with open("/proc/self/maps") as maps:
            return {int(fields[4]) for fields in (line.split(None, 5) for line in maps) if len(fields) > 4}
    except (OSError, ValueError):
        return None


def close_unmapped_shared_memory(before: set[int]) -> int:
    """Close the shared-memory descriptors opened since ``before`` that nothing maps: a Ctrl-C between
    multiprocessing's receipt of a batch's descriptor (recvmsg) and torch's storage taking it leaves
    it in no variable (about 1 run in 20 of real SIGINTs on a CNN's loader).  A live storage maps its
    memory (/proc/self/maps lists its inode), so one that holds a descriptor keeps it.  Returns how
    many were closed."""
    new = shared_memory_fds() - before
    mapped = mapped_inodes() if new else None
    if mapped is None:
        return 0
    closed = 0
    for fd in new:
        try:
            if os.fstat(fd).st_ino not in mapped:
                os.close(fd)
                closed += 1
        except OSError:
            pass
    return closed


@uninterruptible
def free_cut_off_batch(exc: BaseException, shared_before: set[int]) -> None:
    """All an interrupt inside the loader left held: its frames' locals, then (a collection frees the
    batch's storages in cycles among them) the shared-memory descriptors no storage took."""
    release_loader_frames(exc)
    gc.collect()
    close_unmapped_shared_memory(shared_before)
