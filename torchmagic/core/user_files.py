"""Files written for the user (``--trace``): checked before anything runs, written whole or not at
all, and never put in place of a file that was there unless the user asked for that.

A file is written to a temporary name in its own folder, then given its name in one step: a hard
link when nothing may be replaced (it fails, rather than replaces, if the name was taken in the
meantime), a rename when replacing was asked for.  A failure or a Ctrl-C leaves no partial file,
and an existing file is never truncated.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat

from .interrupts import HeldScope, deliver_pending, uninterruptible
from .limits import SettingError

KERNEL_FOLDERS = ("/proc", "/sys")  # the kernel's own interfaces: their "files" are not storage


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "not a regular file"


def _in_kernel_folder(folder: str) -> bool:
    real = os.path.realpath(folder)
    return any(real == root or real.startswith(root + os.sep) for root in KERNEL_FOLDERS)


def check_new_file(setting: str, path: str, overwrite: bool, overwrite_setting: str | None = None) -> str:
    """The absolute path ``path`` names, if a file may be written there: refused in one line
    (SettingError) otherwise.  ``overwrite_setting`` names the switch that allows replacing a file."""
    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    if _in_kernel_folder(folder):
        raise SettingError(setting, f"cannot be written to {path!r}: {folder} is the kernel's, not storage")
    try:
        mode = os.lstat(full).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a folder on the way is a file, or cannot be searched
        raise SettingError(setting, f"cannot be written to {path!r}: {exc.strerror}") from None
    if mode is not None:
        if not stat.S_ISREG(mode):
            raise SettingError(setting, f"{path!r} is {_kind(mode)}: give the path of a regular file")
        if not overwrite:
            switch = overwrite_setting or f"{setting}_overwrite"
            raise SettingError(switch, f"is needed to replace {path!r}, which exists (or choose a new name)")
    if not os.path.isdir(folder):
        raise SettingError(setting, f"cannot be written to {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SettingError(setting, f"cannot be written to {path!r}: folder {folder!r} is not writable")
    return full


class NewFile(HeldScope):
    """``with NewFile(path, overwrite) as f``: write to ``f.temp`` (in ``path``'s folder), then
    ``f.publish()``; the temporary file is gone on the way out, published or not."""

    __slots__ = ("path", "overwrite", "temp")

    def __init__(self, path: str, overwrite: bool):
        self.path, self.overwrite, self.temp = os.path.abspath(path), overwrite, None

    def acquire(self) -> NewFile:
        folder, name = os.path.split(self.path)
        suffix = ".gz" if name.endswith(".gz") else ""  # torch gzips what it writes to a .gz name
        while self.temp is None:
            temp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.partial{suffix}")
            try:
                os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                self.temp = temp
            except FileExistsError:
                continue
        return self

    @uninterruptible
    def publish(self) -> None:
        """Give the written file its name, or raise OSError (FileExistsError: the name was taken)."""
        if os.path.getsize(self.temp) == 0:
            raise OSError(errno.EIO, "nothing was written")
        if self.overwrite:
            os.replace(self.temp, self.path)
        else:
            try:
                os.link(self.temp, self.path)  # fails if the name exists: nothing is replaced
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links: check, then rename
                if os.path.lexists(self.path):
                    raise FileExistsError(errno.EEXIST, "appeared while the trace was written", self.path) from None
                os.rename(self.temp, self.path)
        deliver_pending()

    def release(self) -> None:  # (HeldScope holds a Ctrl-C here)
        if self.temp is not None:
            try:
                os.unlink(self.temp)  # after a link: the published name keeps the file
            except FileNotFoundError:
                pass
            self.temp = None


def publish_copy(source: str, path: str, overwrite: bool) -> None:
    """``source`` (a finished file elsewhere) put at ``path`` as NewFile puts a file: whole or not at all."""
    with NewFile(path, overwrite) as new:
        shutil.copyfile(source, new.temp)
        new.publish()
