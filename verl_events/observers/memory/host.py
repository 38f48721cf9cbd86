"""The process's resident memory and its peak (Linux ``/proc``).

``VmRSS`` is what the process holds now and ``VmHWM`` the most it has held.
Writing ``5`` to ``/proc/self/clear_refs`` sets ``VmHWM`` back to ``VmRSS``
(kernel ``Documentation/filesystems/proc.rst``): no page walk, some 15 µs.
So a stage's host peak is *reset, not sampled*: reset when the stage
begins, ``VmHWM`` when it ends is the most the process held in between,
however short the spike.  What it cannot tell: whose the memory was (every
thread's counts, not only the stage's own allocations).

Where ``clear_refs`` cannot be written, the peak is the larger of the begin
and end figures, and a spike between them is missed (the observer says so
once).  Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["HostGauge", "read_status"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def read_status() -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in bytes, or None where ``/proc/self/status`` has neither."""
    try:
        return _parse(_STATUS.read_bytes())
    except OSError:
        return None


def _parse(status: bytes) -> tuple[int, int] | None:
    try:
        rss = int(status[status.index(b"VmRSS:") + 6 :].split(None, 1)[0])
        hwm = int(status[status.index(b"VmHWM:") + 6 :].split(None, 1)[0])
    except ValueError:
        return None
    return rss * 1024, hwm * 1024  # kB


class HostGauge:
    """Resident bytes and their peak (a :class:`~.peaks.Gauge`).

    The two files stay open: a read at offset 0 of an open ``/proc`` file gives its
    content anew, at a third of the cost of opening it each time.  ``/proc/self`` is the
    process that opened it, so a forked child opens its own."""

    def __init__(self) -> None:
        self._pid = -1
        self._status = self._clear_refs = -1

    def read(self) -> tuple[Sequence[int], Sequence[int]] | None:
        self._open()
        if self._status < 0:
            return None
        try:
            status = _parse(os.pread(self._status, 8192, 0))
        except OSError:
            return None
        return None if status is None else ((status[0],), (status[1],))

    def reset(self) -> bool:
        self._open()
        if self._clear_refs < 0:
            return False
        try:
            os.write(self._clear_refs, b"5")
        except OSError:
            return False
        return True

    def close(self) -> None:
        for fd in (self._status, self._clear_refs):
            if fd >= 0:
                os.close(fd)
        self._pid, self._status, self._clear_refs = -1, -1, -1

    def _open(self) -> None:
        if self._pid == os.getpid():
            return
        self.close()  # a forked child: the parent's descriptors read the parent
        self._pid = os.getpid()
        self._status = _open(_STATUS, os.O_RDONLY)
        self._clear_refs = _open(_CLEAR_REFS, os.O_WRONLY)


def _open(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except OSError:
        return -1
