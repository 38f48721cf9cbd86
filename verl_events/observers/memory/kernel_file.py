"""A file the kernel makes anew at each read (``/proc``, a cgroup's), kept open.

A read at offset 0 of an open ``/proc`` or cgroup file gives its content anew, at a third
of the cost of opening, reading and closing it each time; the memory observer reads several
at every stage.  ``/proc/self`` is the process that opened it, so a forked child opens its
own.  Standard library only.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["KernelFile"]


class KernelFile:
    """One kernel-made file, kept open: :meth:`read` its content, :meth:`write` to it.  Both
    give None / False where the file cannot be opened or the call fails (never raise)."""

    __slots__ = ("_fd", "_flags", "_lock", "_pid", "path")

    def __init__(self, path: Path, flags: int = os.O_RDONLY) -> None:
        self.path = path
        self._flags = flags
        self._fd = -1
        self._pid = -1
        self._lock = threading.Lock()

    def read(self, size: int = 8192) -> bytes | None:
        fd = self._open()
        try:
            return os.pread(fd, size, 0) if fd >= 0 else None
        except OSError:
            return None

    def write(self, data: bytes) -> bool:
        fd = self._open()
        try:
            return fd >= 0 and os.write(fd, data) == len(data)
        except OSError:
            return False

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd, self._pid = -1, -1

    def _open(self) -> int:
        if self._pid == os.getpid():
            return self._fd
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: the parent's reads the parent
                self._close()  # in a child, its copy of the parent's descriptor
                try:
                    self._fd = os.open(self.path, self._flags | os.O_CLOEXEC)
                except OSError:
                    self._fd = -1
                self._pid = os.getpid()
        return self._fd
