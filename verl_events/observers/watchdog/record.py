"""The watchdog's files: hang reports, ``hangs.jsonl`` and the heartbeats.

This module owns the three formats; the watchdog writes them and
``verl-events hangs`` reads them back, both through the names here::

    {save_path}/hangs.jsonl                          one HangRecord per line, every rank
    {save_path}/hangs/step_3_actor_update_rank1.txt  one report per stage that passed its deadline
    {save_path}/heartbeats/rank1.json                one Heartbeat per rank, kept current
    {save_path}/heartbeats/rank1.boundary            the last stage boundary it crossed (.boundary)

A line of ``hangs.jsonl`` (``kind`` is ``"hang"`` when the deadline passed,
``"late"`` when that stage ended after all, with its final time)::

    {"kind": "hang", "run": "…", "time": 1796025667.1, "step": 3, "stage": "actor_update",
     "role": "actor", "rank": 1, "pid": 4242, "host": "node7", "thread": "MainThread",
     "began": 1796025662.0, "elapsed_s": 5.1, "deadline_s": 5.0, "deadline": "fixed",
     "where": {"file": "/work/train.py", "line": 88, "function": "update", "code": "time.sleep(60)"},
     "waiting_in": null, "collective": "not available: ...", "report": "hangs/step_3_actor_update_rank1.txt",
     "action": "report"}

A heartbeat (``open``: the stages open on the rank, outermost first;
``ended``: each stage's last end; ``begun``: how many stages the rank had
begun, comparable across ranks that run the same stages)::

    {"run": "…", "rank": 1, "pid": 4242, "host": "node7", "time": 1796025667.3, "begun": 7,
     "open": [{"stage": "actor_update", "step": 3, "since": 1796025662.0, "begun": 7, "thread": "MainThread"}],
     "last_begun": {"stage": "actor_update", "step": 3, "time": 1796025662.0},
     "last_ended": {"stage": "actor_compute_log_prob", "step": 3, "time": 1796025661.9},
     "ended": {"actor_compute_log_prob": {"step": 3, "time": 1796025661.9}}, "closed": false,
     "liveness_s": 2.0, "started": 1796025600.2, "exit": null, "mtime_beats": true}

``time`` is when the heartbeat was written: the monitor rewrites it when
the rank's position changes, and while nothing changes it beats at least
every ``liveness_s`` by setting the file's mtime to the time of the beat
(:func:`touch_heartbeat`: one ``os.utime``, no new file, no rename, where a
rewrite is a create, a write, a close and a rename in the shared folder).
``mtime_beats`` says the file beats so; :func:`read_heartbeat` then returns
the later of ``time`` and the mtime as ``time``: when the rank last beat.  A
heartbeat much older than ``liveness_s``, not ``closed``, is a rank that
stopped beating; a copy of a run must keep the files' mtimes (``cp -p``,
``rsync -a``, ``verl-events gather``).  ``started`` is its process's start time (from
``/proc``, None elsewhere): with ``pid`` and ``host`` it tells whether that
process still runs (:func:`process_alive`), a pid reused since included.
``exit`` says how a closed rank's process ended: ``{"how": "normal" |
"exception" | "signal", "detail": …}``.

Heartbeats are written whole (a temporary file, then ``os.replace``), so a
reader sees the previous one or the next one; a file cut short anyway (a
disk that filled up) raises :class:`NotAHeartbeat`.  Standard library only.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from verl_events import Record
from verl_events.layout import open_regular, step_dir_name

from .boundary import BEGAN, BOUNDARY_SUFFIX, Boundary, boundary_path, read_boundary
from .crash import crash_log_files, ends_log_path, fatal_files
from .stall_record import STALL_REPORT_PREFIX, stalls_log_path

__all__ = [
    "HANGS_LOG",
    "HEARTBEAT_DIR",
    "KINDS",
    "REPORT_DIR",
    "HangRecord",
    "Heartbeat",
    "NotAHangRecord",
    "NotAHeartbeat",
    "hangs_log_path",
    "heartbeat_dir",
    "heartbeat_files",
    "heartbeat_path",
    "new_report_path",
    "process_alive",
    "process_start_time",
    "read_heartbeat",
    "report_dir",
    "report_files",
    "touch_heartbeat",
    "watchdog_files",
    "write_heartbeat",
]

#: The file under ``save_path`` every rank appends its hangs to.
HANGS_LOG = "hangs.jsonl"
#: The folder under ``save_path`` with one report per stage that passed its deadline.
REPORT_DIR = "hangs"
#: The folder under ``save_path`` with each rank's heartbeat.
HEARTBEAT_DIR = "heartbeats"
#: ``hang``: a deadline passed; ``late``: that stage ended after all.
KINDS = ("hang", "late")

_RANK_FILE = re.compile(r"^rank(-?\d+)\.json$")  # -1: verl's driver (DRIVER_RANK)


def hangs_log_path(save_path: Path) -> Path:
    """``{save_path}/hangs.jsonl``."""
    return Path(save_path) / HANGS_LOG


def heartbeat_dir(save_path: Path) -> Path:
    """``{save_path}/heartbeats``."""
    return Path(save_path) / HEARTBEAT_DIR


def report_dir(save_path: Path) -> Path:
    """``{save_path}/hangs``: the reports."""
    return Path(save_path) / REPORT_DIR


def heartbeat_path(save_path: Path, rank: int) -> Path:
    """``{save_path}/heartbeats/rank{R}.json``."""
    return heartbeat_dir(save_path) / f"rank{rank}.json"


def heartbeat_files(save_path: Path) -> list[Path]:
    """Every rank's heartbeat, by rank."""
    found = [p for p in heartbeat_dir(save_path).glob("rank*.json") if _RANK_FILE.match(p.name)]
    return sorted(found, key=lambda p: int(_RANK_FILE.match(p.name)[1]))  # type: ignore[index]


def report_files(save_path: Path) -> list[Path]:
    """Every hang report of a run, by name."""
    return sorted(report_dir(save_path).glob("*.txt"))


def watchdog_files(save_path: Path, *, stalls: bool = True) -> list[Path]:
    """Every file the watchdog wrote under ``save_path``: heartbeats, hang and stall reports,
    ``hangs.jsonl``, ``stalls.jsonl``, and how processes ended (crash records, the fatal dumps written
    to, ``ends.jsonl``; :mod:`.crash`).  An empty dump is a live process's: not listed.
    ``stalls=False`` leaves out the stalls' files: a process writes them before its first
    stage too, before its installation claims the save_path (each line names its run)."""
    found = [*heartbeat_files(save_path)]
    found += [path for path in report_files(save_path) if stalls or not path.name.startswith(STALL_REPORT_PREFIX)]
    found += sorted(heartbeat_dir(save_path).glob(f"rank*{BOUNDARY_SUFFIX}"))
    logs = (hangs_log_path(save_path), *[stalls_log_path(save_path)] * stalls, ends_log_path(save_path))
    found += [path for path in logs if path.exists()]
    return found + [path for _, path in crash_log_files(save_path)] + fatal_files(save_path, written=True)


def new_report_path(save_path: Path, step: int | None, stage: str, rank: int) -> Path:
    """A report file that does not exist yet: ``hangs/step_{N}_{stage}_rank{R}.txt``,
    then ``…_rank{R}.2.txt`` for the same stage's next hang in that step."""
    folder = report_dir(save_path)
    base = f"{step_dir_name(step)}_{stage}_rank{rank}"
    path, n = folder / f"{base}.txt", 1
    while path.exists():
        n += 1
        path = folder / f"{base}.{n}.txt"
    return path


class NotAHangRecord(ValueError):
    """A line that is not a hang record; the message says what it lacks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HangRecord(Record):
    """One line of ``hangs.jsonl``: a stage that passed its deadline on one
    rank (``kind="hang"``), or that stage ending after all (``"late"``).

    ``elapsed_s`` is how long the stage had run when the deadline was seen to
    pass (``hang``), or its whole time (``late``); ``deadline_s`` the deadline
    and ``deadline`` how it was set (``fixed``: ``timeout_s``; ``first``: the
    first occurrence's; ``adaptive``: a multiple of the longest so far).
    ``where`` is the innermost frame of user code in the stage's thread
    (file, line, function, code), ``waiting_in`` the torch.distributed call
    below it, if any; ``collective`` what torch.distributed could tell of the
    pending collective (or why nothing); ``report`` the report file, relative
    to save_path.  ``begun`` counts the stages the rank had begun.
    """

    kind: str
    run: str | None
    time: float
    step: int | None
    stage: str
    role: str | None = None
    rank: int
    pid: int | None = None
    host: str | None = None
    thread: str | None = None
    began: float
    begun: int = 0
    elapsed_s: float
    deadline_s: float
    deadline: str = "fixed"
    where: dict[str, Any] | None = None
    waiting_in: str | None = None
    collective: str | None = None
    report: str | None = None
    action: str = "report"

    noun = "a hang record"
    not_negative = ("elapsed_s", "deadline_s", "begun")
    refused = NotAHangRecord
    required = ("kind", "time", "step", "stage", "rank", "began", "elapsed_s", "deadline_s")
    choices = {"kind": KINDS}


class NotAHeartbeat(ValueError):
    """A heartbeat file that cannot be read as one (cut short, or another file)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Record):
    """One rank's last position (see the module docstring for the fields).

    ``open`` items and ``last_begun`` / ``last_ended`` are dicts with
    ``stage``, ``step`` and a time (``since`` / ``time``); ``closed`` is True
    once the installation closed (the rank finished its run); ``mtime_beats``
    is True when the liveness beat sets the file's mtime instead of rewriting it
    (False in heartbeats written before it did).
    """

    run: str | None
    rank: int
    pid: int | None = None
    host: str | None = None
    time: float
    begun: int = 0
    open: list[dict[str, Any]] = field(default_factory=list)
    last_begun: dict[str, Any] | None = None
    last_ended: dict[str, Any] | None = None
    ended: dict[str, dict[str, Any]] = field(default_factory=dict)
    closed: bool = False
    liveness_s: float | None = None
    started: float | None = None
    exit: dict[str, Any] | None = None
    mtime_beats: bool = False
    from_boundary: bool = False  # set by the reader: the position is the boundary record's (newer)

    noun = "a heartbeat"
    not_negative = ("begun", "liveness_s")
    refused = NotAHeartbeat

    @classmethod
    def from_json(cls, text: str | bytes) -> Heartbeat:
        """Parse a heartbeat file's text; NotAHeartbeat when it is not one."""
        try:
            data = cls.loads(text)
        except ValueError as exc:
            raise NotAHeartbeat(f"it is not JSON ({exc}); it may have been cut short") from None
        if not isinstance(data, dict) or "rank" not in data or "time" not in data:
            raise NotAHeartbeat("it is not a heartbeat (needs a rank and a time)")
        return cls.known(data)


def write_heartbeat(save_path: Path, heartbeat: Heartbeat) -> None:
    """Replace a rank's heartbeat whole: a temporary file beside it, then ``os.replace``."""
    path = heartbeat_path(save_path, heartbeat.rank)
    # One temporary file per writing thread: the monitor and a signal handler may write at once.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_text(heartbeat.to_json(), encoding="utf-8")
    os.replace(temporary, path)


def touch_heartbeat(save_path: Path, rank: int, when: float) -> None:
    """The liveness beat of a rank whose heartbeat on disk is current: its mtime set to ``when``
    (the rank's clock, as ``time``).  OSError when the file is not there."""
    os.utime(heartbeat_path(save_path, rank), (when, when))


#: The most read of a heartbeat file: a heartbeat is a few hundred bytes, a few open stages.
HEARTBEAT_READ_LIMIT = 2**20


def read_heartbeat(path: Path) -> Heartbeat:
    """A heartbeat file, read; NotAHeartbeat when it is cut short or not one, OSError when unreadable.
    Its ``time`` is when the rank last beat: the file's mtime when that is later and the
    heartbeat says its liveness beat sets the mtime (``mtime_beats``, not ``closed``).  Where the
    rank's boundary record (:mod:`.boundary`) is newer than the heartbeat, its position is the
    record's, and ``from_boundary`` says so."""
    with open_regular(path) as file:
        # Of the file read, whatever replaces it meanwhile; and fresh on NFS, which revalidates at open.
        touched = os.fstat(file.fileno()).st_mtime
        text = file.read(HEARTBEAT_READ_LIMIT + 1)
    if len(text) > HEARTBEAT_READ_LIMIT:
        raise NotAHeartbeat(f"it holds more than {HEARTBEAT_READ_LIMIT} bytes; a heartbeat is a few hundred")
    beat = Heartbeat.from_json(text)
    if beat.mtime_beats and not beat.closed and touched > beat.time:
        beat = replace(beat, time=touched)
    return with_boundary(beat, read_boundary(boundary_path(path)))


def with_boundary(beat: Heartbeat, boundary: Boundary | None) -> Heartbeat:
    """``beat`` with the position of ``boundary`` when that is the later one: the same process
    (pid), and a boundary the heartbeat has not seen (more stages begun, or the same count and a
    later time than the heartbeat's last begin and end).  The stages open on the boundary's
    thread are those below its depth, then the stage it began; other threads' are kept."""
    if boundary is None or boundary.pid != beat.pid or not _as_written(beat):
        return beat
    seen = max((item.get("time") or 0.0) for item in (beat.last_begun or {}, beat.last_ended or {}))
    if boundary.begun < beat.begun or (boundary.begun == beat.begun and boundary.time <= seen):
        return beat
    mine = [item for item in beat.open if item.get("thread_id") == boundary.thread]
    others = [item for item in beat.open if item.get("thread_id") != boundary.thread]
    opened = mine[: boundary.depth]
    position = {"stage": boundary.stage, "step": boundary.step, "time": boundary.time}
    # The store is a sign of life too: the rank lived at least until then.
    changes: dict[str, Any] = {"from_boundary": True, "begun": boundary.begun, "time": max(beat.time, boundary.time)}
    if boundary.kind == BEGAN:
        opened.append(
            {
                "stage": boundary.stage,
                "step": boundary.step,
                "since": boundary.time,
                "begun": boundary.begun,
                "thread_id": boundary.thread,
            }
        )
        changes["last_begun"] = position
    else:
        changes["last_ended"] = position
        changes["ended"] = {**beat.ended, boundary.stage: {"step": boundary.step, "time": boundary.time}}
    return replace(beat, open=others + opened, **changes)


def _as_written(beat: Heartbeat) -> bool:
    """Whether the times inside ``beat`` that :func:`with_boundary` reads are numbers (the
    reader checked the fields' own types); a heartbeat someone else wrote is read as it is,
    without the boundary record."""

    def point(item: Any) -> bool:
        when = item.get("time", 0.0) if isinstance(item, dict) else None
        return item is None or (isinstance(when, (int, float)) and not isinstance(when, bool))

    return point(beat.last_begun) and point(beat.last_ended)


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` of this host started (Unix seconds, from ``/proc``), or None
    when it does not exist or this system has no ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22: start time, in clock ticks after boot
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def process_alive(pid: int, started: float | None) -> bool | None:
    """Whether process ``pid`` of this host still runs: False when no process
    has that pid (or none can: a pid past what the kernel hands out), it is a
    zombie, or one started at another time has it (the pid was reused); None
    when this cannot be told: not permitted to look, or no start time to tell
    the rank's process from another that has its pid now (a heartbeat of an
    older writer, or one a hand wrote: pid 1 is always some process)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return None
    except OSError:
        return None
    try:  # a zombie (dead, not yet reaped by its parent) still answers kill(pid, 0)
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X"):
            return False
    except (OSError, IndexError):
        pass
    if started is None:
        return None
    now = process_start_time(pid)
    return now is None or abs(now - started) < 2.0
