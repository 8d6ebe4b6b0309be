"""Keep kineto's start/stop banner out of the user's output.

torch 2.13 prints ``USDT:... profiler_start`` / ``profiler_stop`` from C++ to file
descriptor 2 each time a profiler starts or stops; in JupyterLab that is two red lines
under every profiled cell.  Only those two lines are dropped: anything else written to
stderr meanwhile (a real kineto warning) is passed on.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

_BANNER = re.compile(r"^USDT:.*\] profiler_(start|stop)\s*$")


@contextlib.contextmanager
def without_profiler_banner() -> Iterator[None]:
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real fd 2 (embedded interpreters)
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not _BANNER.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()
