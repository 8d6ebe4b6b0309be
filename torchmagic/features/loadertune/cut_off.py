"""What a Ctrl-C holds when it cuts off torch's DataLoader while a batch crosses from a worker.

A worker sends a batch's tensors as shared memory: the main process asks the worker's resource
sharer for the memory's file descriptor over a socket.  An interrupt inside that exchange leaves the
socket's connection in the frames of the traceback, which IPython keeps (seen in real SIGINTs on a
CNN's loader, benchmarks/real_interrupts.py).
"""

from __future__ import annotations

import multiprocessing
import os

import torch.utils.data

_LOADER_CODE = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch.utils.data, multiprocessing))


def release_loader_frames(exc: BaseException) -> None:
    """Free the locals of the finished DataLoader and multiprocessing frames in ``exc``'s traceback
    (a half-open socket to a worker); they still show, and the user's and torchmagic's are left."""
    tb = exc.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_LOADER_CODE):
            try:
                tb.tb_frame.clear()
            except RuntimeError:  # still executing
                pass
        tb = tb.tb_next
