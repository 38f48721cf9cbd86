"""How a rank's process ended: the watchdog's crash records and fatal-signal dumps.

This module owns the two formats; the watchdog writes them and
``verl-events diagnose`` reads them back, both through the names here::

    {save_path}/crashes/rank1.jsonl        one CrashRecord per line: a stage that raised, a signal
    {save_path}/crashes/rank1.fatal.txt    faulthandler's dump of every thread at a fatal signal
    {save_path}/crashes/rank1.SIGTERM.txt  the stack of the thread that took SIGTERM (SIGHUP, SIGINT), default action
    {save_path}/crashes/ends.jsonl         one ProcessEnd per process: how it ended, and its ranks

A line of ``rank{R}.jsonl``; ``kind`` is ``"exception"`` (a stage body
raised: the innermost stage, once) or ``"signal"`` (SIGTERM, SIGINT or
SIGHUP arrived and a Python handler was there before ours; ``open`` lists
the stages open then, outermost first)::

    {"kind": "exception", "run": "…", "time": 1796025667.1, "rank": 1, "pid": 4242, "host": "node7",
     "step": 2, "stage": "actor_update", "role": "actor", "parent": null, "error_type": "RuntimeError",
     "message": "Connection closed by peer [127.0.0.1]:29500",
     "where": {"file": "/work/train.py", "line": 88, "function": "update", "code": "dist.all_reduce(t)"},
     "traceback": "Traceback (most recent call last): …", "signal": null, "open": []}

A line of ``ends.jsonl``, written by every process at close, or when a
terminating signal reaches a Python handler that was there before ours
(Ray's ends the process at once); ``how`` is ``normal``, ``exception`` or
``signal``; ``ranks`` is empty for a process that ran no stage (verl's
driver)::

    {"run": "…", "time": 1796025667.1, "pid": 4242, "host": "node7", "ranks": [1],
     "how": "exception", "detail": "RuntimeError: …"}

A fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL) leaves no JSON:
the process cannot run Python any more.  Python's :mod:`faulthandler`
writes its text instead (``Fatal Python error: Segmentation fault``, then
each thread's frames, most recent call first), from the signal handler
itself.  So does a terminating signal whose action was the default (the
process dies of it at once, even with its main thread blocked in C, where
no Python handler could run): the file's name says which signal, and its
text has no ``Fatal Python error`` line.  A dump's modification time is
the time of death.  An empty dump file is a process that never got that
signal (the watchdog removes it at close).  Standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_events import Record
from verl_events.layout import read_regular

__all__ = [
    "CRASH_DIR",
    "CRASH_KINDS",
    "FATAL_SIGNALS",
    "FATAL",
    "CrashRecord",
    "ENDS_LOG",
    "ProcessEnd",
    "FatalDump",
    "NotACrashRecord",
    "crash_dir",
    "crash_log_files",
    "crash_log_path",
    "ends_log_path",
    "fatal_files",
    "fatal_path",
    "read_fatal",
]

#: The folder under ``save_path`` with each rank's crash records and fatal dumps.
CRASH_DIR = "crashes"
#: The file under the crash folder where every process says how it ended.
ENDS_LOG = "ends.jsonl"
#: ``exception``: a stage raised; ``signal``: a terminating signal arrived.
CRASH_KINDS = ("exception", "signal")
#: faulthandler's words for each fatal signal it catches.
FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Floating point exception": "SIGFPE",
    "Aborted": "SIGABRT",
    "Illegal instruction": "SIGILL",
}

_LOG = re.compile(r"^rank(-?\d+)\.jsonl$")  # -1: verl's driver (DRIVER_RANK)
_FATAL = re.compile(r"^(?:rank(-?\d+)|pid(\d+))\.(fatal|SIG[A-Z]+)\.txt$")
#: The middle of a fatal signal's dump name; a terminating signal's is the signal's name.
FATAL = "fatal"


def crash_dir(save_path: Path) -> Path:
    """``{save_path}/crashes``."""
    return Path(save_path) / CRASH_DIR


def crash_log_path(save_path: Path, rank: int) -> Path:
    """``{save_path}/crashes/rank{R}.jsonl``."""
    return crash_dir(save_path) / f"rank{rank}.jsonl"


def ends_log_path(save_path: Path) -> Path:
    """``{save_path}/crashes/ends.jsonl``."""
    return crash_dir(save_path) / ENDS_LOG


def fatal_path(save_path: Path, *, rank: int | None = None, pid: int | None = None, signal: str = FATAL) -> Path:
    """``crashes/rank{R}.fatal.txt``, or ``crashes/pid{P}.fatal.txt`` before the rank is known;
    ``signal`` (``SIGTERM``) names a terminating signal's dump instead."""
    if (rank is None) == (pid is None):
        raise ValueError("a fatal dump is named by a rank or by a pid, not both")
    return crash_dir(save_path) / (f"rank{rank}.{signal}.txt" if rank is not None else f"pid{pid}.{signal}.txt")


def crash_log_files(save_path: Path) -> list[tuple[int, Path]]:
    """Every rank's crash log, as (rank, path), by rank."""
    found = [(int(m[1]), p) for p in crash_dir(save_path).glob("rank*.jsonl") if (m := _LOG.match(p.name))]
    return sorted(found)


def fatal_files(save_path: Path, *, written: bool = False) -> list[Path]:
    """Every fatal dump under ``save_path``, by name; with ``written``, only those
    that are not empty (a live process keeps an empty one open)."""
    found = sorted(p for p in crash_dir(save_path).glob("*.txt") if _FATAL.match(p.name))
    return [p for p in found if _size(p) > 0] if written else found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class NotACrashRecord(ValueError):
    """A line that is not a crash record; the message says what it lacks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CrashRecord(Record):
    """One line of ``crashes/rank{R}.jsonl`` (see the module docstring).

    ``step``, ``stage`` and ``role`` are the stage that raised, or the
    innermost stage open when the signal arrived (None when none was);
    ``parent`` the stage enclosing it (verl's ``train_batch`` runs inside
    ``actor_update``).
    ``where`` is the innermost user frame of the exception's traceback
    (:mod:`verl_events.frames`), or of the main thread for a signal.
    """

    kind: str
    run: str | None
    time: float
    rank: int
    pid: int | None = None
    host: str | None = None
    step: int | None = None
    stage: str | None = None
    role: str | None = None
    parent: str | None = None
    error_type: str | None = None
    message: str | None = None
    where: dict[str, Any] | None = None
    traceback: str | None = None
    signal: str | None = None
    open: list[dict[str, Any]] = field(default_factory=list)

    noun = "a crash record"
    refused = NotACrashRecord
    required = ("kind", "time", "rank")
    choices = {"kind": CRASH_KINDS}


#: How a process ended, in ``ends.jsonl``; ``abort``: the watchdog ended it (``action: abort``).
ENDINGS = ("normal", "exception", "signal", "abort")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessEnd(Record):
    """One line of ``crashes/ends.jsonl`` (see the module docstring)."""

    run: str | None
    time: float
    pid: int
    host: str | None = None
    ranks: list[int] = field(default_factory=list)
    how: str
    detail: str | None = None

    noun = "a process's end"
    required = ("time", "pid", "how")
    choices = {"how": ENDINGS}


@dataclass(frozen=True, slots=True)
class FatalDump:
    """A fatal dump, read: the signal, when, and each thread's frames.

    ``threads`` maps a thread's header (``Current thread 0x…`` for the one
    that got the signal; ``Stack`` in a terminating signal's dump, which
    holds that thread alone) to its frames, innermost first, as (file, line,
    function); ``current`` is that thread's frames (for a terminating
    signal, the thread the kernel chose to run the handler on: any thread).
    """

    path: Path
    rank: int | None
    pid: int | None
    error: str  # faulthandler's words ("Segmentation fault"), or "terminated by SIGTERM"
    signal: str | None  # "SIGSEGV", or None when faulthandler's words are not known here
    time: float
    threads: dict[str, list[tuple[str, int, str]]]
    current: list[tuple[str, int, str]]


_ERROR = re.compile(r"^Fatal Python error: (.+?)\s*$")
# "Stack" heads the one thread's stack of a terminating signal's dump (faulthandler's all_threads=False).
_THREAD = re.compile(r"^((?:Current thread|Thread) 0x[0-9a-fA-F]+.*?|Stack)(?: \(most recent call first\))?:\s*$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+?)\s*$')


#: The most read of a fatal dump: faulthandler writes at most 100 threads of 100 frames.
FATAL_READ_LIMIT = 16 * 2**20


def read_fatal(path: Path) -> FatalDump | None:
    """A fatal dump, or None when the file is empty (no fatal signal).
    OSError when it cannot be read; ValueError when it is not faulthandler's text."""
    text = read_regular(path, FATAL_READ_LIMIT).decode("utf-8", errors="replace")
    if not text.strip():
        return None
    error: str | None = None
    if "Fatal Python error:" in text:  # appended dumps of earlier processes at this rank: the last one
        text = text[text.rindex("Fatal Python error:") :]
    threads: dict[str, list[tuple[str, int, str]]] = {}
    current: list[tuple[str, int, str]] = []
    frames: list[tuple[str, int, str]] | None = None
    for line in text.splitlines():
        if error is None and (match := _ERROR.match(line)):
            error = match[1]
        elif match := _THREAD.match(line):
            frames = threads.setdefault(match[1], [])
            if match[1].startswith(("Current thread", "Stack")):
                current = frames
        elif frames is not None and (match := _FRAME.match(line)):
            frames.append((match[1], int(match[2]), match[3]))
        elif not line.strip():
            frames = None
    named = _FATAL.match(path.name)
    rank = int(named[1]) if named and named[1] else None
    pid = int(named[2]) if named and named[2] else None
    kind = named[3] if named else FATAL
    if kind != FATAL:
        error, signal = f"terminated by {kind}", kind
    elif error is None:
        raise ValueError(f"{path} is not a faulthandler dump (no 'Fatal Python error:' line)")
    else:
        signal = FATAL_SIGNALS.get(error)
    if not threads:
        raise ValueError(f"{path} is not a faulthandler dump (no thread's frames)")
    return FatalDump(path, rank, pid, error, signal, os.stat(path).st_mtime, threads, current)
