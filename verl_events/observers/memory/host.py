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

from .kernel_file import KernelFile

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
    """Resident bytes and their peak (a :class:`~.peaks.Gauge`), from the two files kept
    open (:mod:`.kernel_file`)."""

    def __init__(self) -> None:
        self._status = KernelFile(_STATUS)
        self._clear_refs = KernelFile(_CLEAR_REFS, os.O_WRONLY)

    def read(self) -> tuple[Sequence[int], Sequence[int]] | None:
        text = self._status.read()
        status = None if text is None else _parse(text)
        return None if status is None else ((status[0],), (status[1],))

    def reset(self) -> bool:
        return self._clear_refs.write(b"5")

    def close(self) -> None:
        self._status.close()
        self._clear_refs.close()
