"""A large run's logs, read without parsing every line: what keeps ``diagnose`` fast at a thousand ranks.

A run of 1,024 ranks and 1,000 steps holds about 8 million lines in each of its timing and
memory logs (7.6 and 5.8 GiB): reading every byte of them takes 20 s on a 2-core machine,
parsing every line 90 s and more memory than the machine has.  ``diagnose`` needs few of
those lines.  Each kind of log whose files hold more than :data:`FULL_READ_BYTES` in all is
read by what it needs only:

* the timing logs: the end of each rank's log (its last :data:`TAIL_BYTES`).  A stage that
  raises ends the rank's work in verl: the exception leaves every enclosing stage too, and
  those lines are the last the rank wrote.  Stage times and stragglers are the report's
  (``verl-events report``), which reads every line;
* the memory logs: the end of the log of each rank that needs explaining (one that raised
  an out-of-memory error, one that was killed), not the others;
* the weight-sync ledger: a byte search for a non-empty ``alarms`` list (the only lines
  diagnose shows), then those lines parsed; every alarm is found.

Below that size every line is read, as always; ``--read-all`` reads every line whatever
the size.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from verl_events.layout import open_regular

from .record import Evidence, of_this_run

__all__ = [
    "ALARM_LINE",
    "CHUNK_BYTES",
    "FULL_READ_BYTES",
    "TAIL_BYTES",
    "lines_matching",
    "tail_records",
    "total_bytes",
]

R = TypeVar("R")

#: Logs of one kind larger than this in all are read in part (see the module docstring).
FULL_READ_BYTES = 256 * 2**20
#: The end of a rank's log read in part: far more than the few stages an exception leaves
#: (a line is under 4 KiB with the longest message a record keeps).
TAIL_BYTES = 64 * 2**10
#: What the byte search reads at a time.
CHUNK_BYTES = 16 * 2**20
#: A weight-sync line with an alarm: its ``alarms`` list holds an object.
ALARM_LINE = re.compile(rb'"alarms":\s*\[\s*\{')


def total_bytes(paths: Iterable[Path]) -> int:
    """The size of the files in all (a file gone meanwhile counts nothing)."""
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
    return total


def tail_records(evidence: Evidence, path: Path, parse: Callable[[str], R]) -> Iterator[R]:
    """The records among the last :data:`TAIL_BYTES` of ``path``, in file order; the first
    line there, cut by where the tail begins, is left out unless the tail is the whole file.
    A line that is not a record, and a file that cannot be read, are warnings."""
    try:
        with open_regular(path) as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - TAIL_BYTES)
            handle.seek(start)
            data = handle.read()
    except OSError as exc:
        evidence.warnings.append(f"{path} cannot be read: {exc}")
        return
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]
    for line in lines:
        if not line.strip():
            continue
        try:
            record = parse(line.decode())
        except ValueError as exc:  # UnicodeDecodeError is one
            evidence.warnings.append(f"{path}: a line near its end was skipped: {exc}")
            continue
        if of_this_run(evidence, getattr(record, "run", None), f"{path} (near its end)"):
            yield record


def lines_matching(
    evidence: Evidence, path: Path, pattern: re.Pattern[bytes], parse: Callable[[str], R]
) -> Iterator[tuple[int, R]]:
    """The records of the lines of ``path`` that ``pattern`` finds, with their line numbers,
    in file order: a byte search, :data:`CHUNK_BYTES` at a time, with no line parsed but those."""
    try:
        handle = open_regular(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        evidence.warnings.append(f"{path} cannot be read: {exc}")
        return
    with handle:
        number, rest = 1, b""
        while True:
            chunk = handle.read(CHUNK_BYTES)
            data = rest + chunk
            cut = data.rfind(b"\n") + 1 if chunk else len(data)  # whole lines; at the end, all that is left
            data, rest = data[:cut], data[cut:]
            yield from _matching(evidence, path, data, number, pattern, parse)
            number += data.count(b"\n")
            if not chunk:
                return


def _matching(
    evidence: Evidence, path: Path, data: bytes, number: int, pattern: re.Pattern[bytes], parse: Callable[[str], R]
) -> Iterator[tuple[int, R]]:
    """The matching lines of ``data`` (whole lines, the first of them line ``number``)."""
    counted_to, after = 0, -1
    for found in pattern.finditer(data):
        start = data.rfind(b"\n", 0, found.start()) + 1
        if start <= after:
            continue  # a second match on a line already read
        end = data.find(b"\n", found.end())
        end = len(data) if end < 0 else end
        number += data.count(b"\n", counted_to, start)
        counted_to, after = start, end
        try:
            record = parse(data[start:end].decode())
        except ValueError as exc:  # UnicodeDecodeError is one
            evidence.warnings.append(f"{path}:{number} was skipped: {exc}")
            continue
        if of_this_run(evidence, getattr(record, "run", None), f"{path}:{number}"):
            yield number, record
