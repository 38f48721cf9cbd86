"""Opening a file of a run folder, which many processes, ``gather`` or another person may
have written: regular files only, checked without blocking, and read within a stated bound.

A FIFO where a log belongs would block a reader forever, a link to ``/dev/zero`` never end,
a directory or a device is no log at all: :func:`open_regular` opens without blocking,
looks at what it opened, and refuses anything but a regular file with
:class:`RunFileRefused`, an OSError, so that every reader's ``except OSError`` turns it into
its one warning (``PATH cannot be read: it is a FIFO, not a regular file …``) and goes on.
:func:`read_regular` reads a whole file of at most ``limit`` bytes.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

__all__ = ["LOG_READ_LIMIT", "RunFileRefused", "open_regular", "read_regular"]

#: The most a reader reads of one log whole (1 GiB): far past any log a run writes per rank
#: (a rank's timing log holds about 500 bytes a stage), and a bound on what a crafted or
#: damaged file can cost.  diagnose reads only the ends of large logs unless asked.
LOG_READ_LIMIT = 2**30

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class RunFileRefused(OSError):
    """A file of a run that a reader will not read: not a regular file, or past its bound."""


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading in binary, when it is a regular file (a link to one is
    followed); RunFileRefused naming what it is otherwise, without blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise RunFileRefused(f"it is {kind}, not a regular file (readers open regular files only)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, limit: int = LOG_READ_LIMIT) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`); RunFileRefused when it
    holds more than ``limit``."""
    with open_regular(path) as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise RunFileRefused(f"it holds more than {limit} bytes, the most a reader reads of it")
    return data
