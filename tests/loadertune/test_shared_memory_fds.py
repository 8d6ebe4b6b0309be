"""A batch's shared-memory descriptor that a Ctrl-C left in no variable is closed; one a storage
holds is not."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch

from torchmagic.features.loadertune.cut_off import close_unmapped_shared_memory, shared_memory_fds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.isdir("/dev/shm"),
                                reason="reads /proc and /dev/shm")


def _orphan() -> int:
    """A descriptor on an unlinked /dev/shm file that nothing maps, as recvmsg leaves one."""
    fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="torch_test_")
    os.unlink(path)
    os.ftruncate(fd, 4096)
    return fd


def test_only_the_unmapped_new_descriptor_is_closed():
    old = _orphan()  # open before: the user's, never ours to close
    before = shared_memory_fds()
    assert old in before
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"  # Linux's default: what loaders use
    shared = torch.arange(1 << 16, dtype=torch.float32).share_memory_()  # a live storage keeping its descriptor
    kept = shared_memory_fds() - before
    assert len(kept) == 1
    orphan = _orphan()
    try:
        assert close_unmapped_shared_memory(before) == 1
        with pytest.raises(OSError):
            os.fstat(orphan)
        assert kept <= shared_memory_fds()  # the storage's own descriptor stays
        assert shared.sum().item() == sum(range(1 << 16))
        os.fstat(old)
    finally:
        os.close(old)


def test_nothing_new_nothing_closed():
    assert close_unmapped_shared_memory(shared_memory_fds()) == 0
