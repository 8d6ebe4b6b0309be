"""A compile interrupted is a compile that never happened: no partial file left in inductor's cache,
no half-made entry in its in-memory code caches, no torch frames in the traceback the user sees.

Inductor writes its sources and cache entries atomically (a temporary file, then a rename), but the
C++ compiler writes a kernel's ``.so`` (and ``.o``) in place, and inductor takes any file at that
path as built.  A Ctrl-C in a notebook or a terminal reaches the whole process group, the compiler
and linker included: a linker stopped mid-write leaves an empty or truncated ``.so`` that fails
every later compile of that graph, in any process ("file too short").  In this process the
interrupted build also stays in inductor's code cache as a failed future, which fails the next
compile of the same kernel here.  So after an interrupted comparison the binaries written since it
began are checked (under inductor's own lock for each, so a build still running is not touched)
and the partial ones removed, and the code-cache entries added since it began are dropped (a later
compile loads or rebuilds them).  Code compiled before the comparison, the user's included, keeps
its entries: ``torch._dynamo.reset()`` is not called.
"""

from __future__ import annotations

import os
import struct
import sys
import sysconfig
import time
from types import TracebackType

_BINARIES = (".so", ".o", ".dylib", ".dll", ".pyd", ".gch", ".pch")  # what a C++ compiler writes in place
_LOCK_WAIT_S = 1.0  # a build still holding its lock after this is alive and finishes its file itself
_CODECACHE = "torch._inductor.codecache"


class CompileLeftovers:
    """Taken before a comparison compiles anything; ``clean()`` after it was cut short."""

    def __init__(self) -> None:
        self.started = time.time()
        try:
            self._entries = {id(cache): set(cache) for cache in _code_caches()}
        except Exception:  # noqa: BLE001  (as in clean(): it then says so)
            self._entries = {}

    def clean(self) -> list[str]:
        """Drop the code-cache entries added since, remove the partial binaries written since;
        one line for each file removed (or on why the cache could not be checked)."""
        try:
            for cache in _code_caches():
                for key in set(cache) - self._entries.get(id(cache), set()):
                    cache.pop(key, None)
            return [f"interrupted compile: removed the partial file it left in inductor's cache, {path}"
                    for path in _remove_partial_binaries(self.started)]
        except Exception as exc:  # noqa: BLE001  private inductor API: a newer torch may differ
            return [f"interrupted compile: could not check inductor's cache for partial files "
                    f"({type(exc).__name__}: {exc})"]


def _code_caches() -> list[dict]:
    """Inductor's in-memory caches of compiled C++ (source hash -> loader), once inductor is loaded."""
    codecache = sys.modules.get(_CODECACHE)
    if codecache is None:
        return []
    found, classes = [], [codecache.CppCodeCache]
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        cache = vars(cls).get("cache")
        if isinstance(cache, dict):
            found.append(cache)
    return found


def inductor_cache_dir() -> str | None:
    """The folder inductor compiles into (it sets TORCHINDUCTOR_CACHE_DIR when it first uses it)."""
    directory = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if directory is None and _CODECACHE in sys.modules:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        directory = default_cache_dir()
    return directory if directory and os.path.isdir(directory) else None


def _remove_partial_binaries(since: float) -> list[str]:
    directory = inductor_cache_dir()
    if directory is None:
        return []
    removed = []
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(_BINARIES) and _written_since(path, since) and _remove_if_partial(directory, path):
                removed.append(path)
    return removed


def _written_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since - 1.0  # some filesystems keep whole seconds
    except OSError:
        return False


def _remove_if_partial(directory: str, path: str) -> bool:
    """Remove ``path`` if it is partial, holding the lock inductor builds it under."""
    from filelock import FileLock, Timeout  # what inductor's own lock is (torch depends on it)

    key = os.path.basename(path).split(".")[0]
    try:
        with FileLock(os.path.join(directory, "locks", key + ".lock"), timeout=_LOCK_WAIT_S):
            if not is_partial(path):
                return False
            os.remove(path)
            return True
    except (Timeout, OSError):
        return False


def is_partial(path: str) -> bool:
    """Whether a compiler's output file was cut off: empty, or (on Linux, where it is ELF) without
    its header, or shorter than the header says.  A linker writes the header and the tables it
    points to last."""
    with open(path, "rb") as file:
        head = file.read(64)
        size = os.fstat(file.fileno()).st_size
    if size == 0:
        return True
    if not sys.platform.startswith("linux"):
        return False
    if head[:4] != b"\x7fELF" or len(head) < 52:
        return True
    order = "<" if head[5] == 1 else ">"
    if head[4] == 2:  # 64-bit
        if len(head) < 64:
            return True
        phoff, shoff = struct.unpack_from(order + "QQ", head, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 54)
    else:
        phoff, shoff = struct.unpack_from(order + "II", head, 28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 42)
    return size < max(phoff + phnum * phentsize, shoff + shnum * shentsize)


# --- the traceback ------------------------------------------------------------------------

def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # inductor's generated code
    return tuple(dirs | ({os.path.abspath(cache) + os.sep} if cache else set()))


def hide_torch_frames(exc: BaseException) -> None:
    """Leave torch's frames out of ``exc``'s traceback, and the library frames torch called
    (subprocess, threading, generated code), so a Ctrl-C during a compile shows where the user's
    code was, not 700 lines of dynamo and inductor.  The user's own frames stay, those torch
    called included (a forward run eagerly, a hook)."""
    torch_dir, libraries = _torch_dir(), _library_dirs()
    kept: list[TracebackType] = []
    in_torch = False
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        if path.startswith(torch_dir):
            in_torch = True
        elif in_torch and (path.startswith(libraries) or _generated(path)):
            pass
        else:
            in_torch = False
            kept.append(tb)
        tb = tb.tb_next
    if not kept:
        return
    for earlier, later in zip(kept, kept[1:]):
        earlier.tb_next = later
    kept[-1].tb_next = None
    exc.__traceback__ = kept[0]


def _generated(filename: str) -> bool:
    """Code made at run time (FX's ``<eval_with_key>.N``, ``<string>``, frozen importlib), not an
    IPython cell."""
    return filename.startswith("<") and not filename.startswith("<ipython-input-")
