"""Where a rank is at every stage boundary, on disk: ``heartbeats/rank{R}.boundary``.

The heartbeat is rewritten at most every ``heartbeat_s``, from the monitor thread.  A rank
killed within that time of a boundary leaves a heartbeat one or two boundaries behind: measured
on verl's trainer, a rank killed as ``actor_update`` began read as killed in the stage before.
So each hook also stores the boundary it crossed into one page of a file mapped into memory
(``MAP_SHARED``): a store into the page cache, which the kernel keeps and writes back when the
process dies, by SIGKILL too (a machine that loses power loses it, as it loses the heartbeat).

The record, little-endian, guarded by a sequence number that is odd while a store is under way
(a reader that sees it odd, or changed across its read, reads again)::

    0   u64  sequence
    8   u32  format version (1)
    12  u32  pid of the process that wrote it
    16  u8   kind: 1 a stage began, 2 a stage ended
    17  u8   depth (stages open on that thread under it)
    18  u16  length of the stage's name in bytes
    20  u32  (unused)
    24  i64  step (-1: unknown)
    32  u64  begun: how many stages the rank had begun
    40  f64  time (Unix seconds)
    48  u64  thread id
    56       the stage's name, UTF-8, at most 200 bytes

:func:`~.record.read_heartbeat` reads it beside the heartbeat and takes the newer of the two.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BEGAN", "BOUNDARY_SUFFIX", "ENDED", "Boundary", "BoundaryWriter", "boundary_path", "read_boundary"]

BOUNDARY_SUFFIX = ".boundary"
BEGAN, ENDED = 1, 2
_VERSION = 1
_SEQUENCE = struct.Struct("<Q")
_BODY = struct.Struct("<IIBBHIqQdQ")
_RECORD = struct.Struct("<QIIBBHIqQdQ")  # the sequence, then the body
_NAME_AT = _SEQUENCE.size + _BODY.size
_NAME_MAX = 200
_SIZE = 4096  # one page
_READS = 5  # a reader's tries while a store is under way


@dataclass(frozen=True, slots=True)
class Boundary:
    """The last stage boundary a rank crossed (see the module docstring)."""

    pid: int
    kind: int
    depth: int
    stage: str
    step: int | None
    begun: int
    time: float
    thread: int


class BoundaryWriter:
    """One rank's boundary record, open for stores.  Not thread-safe: the watchdog stores
    under its table's lock."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, _SIZE)
            self._map = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)  # the mapping keeps the file
        self._sequence = 0
        self._pid = os.getpid()
        self._names: dict[str, bytes] = {}  # each stage's name, encoded once

    def store(self, kind: int, stage: str, step: int | None, depth: int, begun: int, at: float, thread: int) -> None:
        name = self._names.get(stage)
        if name is None:
            name = self._names[stage] = stage.encode()[:_NAME_MAX]
        sequence = self._sequence + 1
        # The odd sequence goes in with the fields (one store), the even one after the name.
        _RECORD.pack_into(
            self._map,
            0,
            sequence,
            _VERSION,
            self._pid,
            kind,
            min(depth, 255),
            len(name),
            0,
            -1 if step is None else step,
            begun,
            at,
            thread,
        )
        self._map[_NAME_AT : _NAME_AT + len(name)] = name
        self._sequence = sequence + 1
        _SEQUENCE.pack_into(self._map, 0, self._sequence)

    def close(self) -> None:
        self._map.close()


def boundary_path(heartbeat: Path) -> Path:
    """``rank{R}.boundary`` beside ``rank{R}.json``."""
    return heartbeat.with_suffix(BOUNDARY_SUFFIX)


def read_boundary(path: Path) -> Boundary | None:
    """The record at ``path``; None when there is none, it is not a regular file of the
    record's size (checked without blocking: a FIFO there is no record), it is of another
    format, or a store never let a read through."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_size != _SIZE:
            return None
        for _ in range(_READS):
            data = os.pread(fd, _NAME_AT + _NAME_MAX, 0)
            (again,) = _SEQUENCE.unpack(os.pread(fd, _SEQUENCE.size, 0))
            (sequence,) = _SEQUENCE.unpack_from(data, 0)
            if sequence == 0:
                return None  # created, nothing stored yet
            if sequence % 2 or sequence != again:
                continue
            version, pid, kind, depth, length, _, step, begun, at, thread = _BODY.unpack_from(data, _SEQUENCE.size)
            if version != _VERSION or kind not in (BEGAN, ENDED) or length > _NAME_MAX:
                return None
            stage = data[_NAME_AT : _NAME_AT + length].decode(errors="replace")
            return Boundary(pid, kind, depth, stage, None if step < 0 else step, begun, at, thread)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None
