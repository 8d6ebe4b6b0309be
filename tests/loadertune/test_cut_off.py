"""A Ctrl-C inside multiprocessing's exchange with a DataLoader worker (a batch's shared memory asked
for over a socket) left that connection open in the traceback IPython keeps: +1 socket fd in 2-3 of
80 real SIGINTs on a CNN's loader.  The loader's and multiprocessing's finished frames are freed."""

import multiprocessing
import signal

import pytest

from torchmagic.features.loadertune.cut_off import release_loader_frames


def _interrupted_while_receiving():
    reader, writer = multiprocessing.Pipe(duplex=False)
    mine = ["the user's local"]

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    try:
        reader.recv()  # blocks: no one writes
    except KeyboardInterrupt as exc:
        return exc, reader, writer, mine
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    pytest.fail("recv returned")


def test_the_loader_frames_an_interrupt_passed_through_are_freed_and_the_users_kept():
    exc, reader, writer, mine = _interrupted_while_receiving()
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    library = [f for f in frames if "multiprocessing" in f.f_code.co_filename]
    assert library and any(f.f_locals.get("self") is reader for f in library)  # the connection, held
    release_loader_frames(exc)
    assert all(not f.f_locals for f in library)
    assert frames[0].f_locals.get("mine") is mine  # the caller's frame is left whole (for %debug)
    reader.close()
    writer.close()
