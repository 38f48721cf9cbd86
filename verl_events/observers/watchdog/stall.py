"""A deadline on a process's progress: the time it spends with no stage open.

The idle time begins at the installation and at every end of the last open
stage, and ends when a stage begins again.  Its deadline is the watchdog's
``stall_s`` when set; else ``start_s`` before the process's first stage
(model loading, compiling and a cluster coming up are that gap), and after
it, adaptive like a stage's and per kind of gap, keyed by the stage that
ended before it (the gap after ``actor_update`` holds the next rollout; the
one after ``save_checkpoint`` something else): ``first_s`` the first time,
then ``multiple`` x the longest such gap so far, at least ``floor_s``.

When the deadline passes, the monitor (:mod:`.monitor`) first looks at the
run's heartbeats (:func:`run_progress`): while a rank of another process
sharing the save_path has a stage open within its deadline, or crossed a
stage boundary within the idle deadline, the run is making progress and this
process is waiting for it (verl's trainer ranks while the driver waits for
generation; processes that never run a stage, such as ``main_ppo``, a
rollout server or a storage unit).  The deadline is then set to when that
evidence runs out (the stage's deadline; the boundary's age reaching the
idle deadline), and the heartbeats are read again then.  Otherwise
:func:`report_stall`: a report with every thread's stack, one ``stall`` line
in ``stalls.jsonl`` (:mod:`.stall_record`) and one WARNING; when a stage
begins again, or the process ends, one ``resumed`` line.  A stall is
reported, never acted on (``action: abort`` ends a process for a stage past
its deadline only).

The hooks touch :class:`IdleWatch` only at the outermost boundaries (no
stage open before a begin, none left after an end), under the table's lock.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from verl_events import rank_name
from verl_events.layout import run_id

from .._lines import append_line
from .record import NotAHeartbeat, heartbeat_files, read_heartbeat, report_dir
from .stacks import ThreadStack, describe_where, thread_stacks
from .stall_record import StallRecord, finite_number, new_stall_report_path, stalls_log_path

__all__ = ["CLOCK_SKEW_S", "Idle", "IdleWatch", "report_resumed", "report_stall", "run_progress"]

logger = logging.getLogger("verl_events.watchdog")

#: How far another host's clock may be from this one's when its heartbeat is read (as the readers allow).
CLOCK_SKEW_S = 60.0


@dataclass(frozen=True, slots=True)
class Idle:
    """One idle time whose deadline passed: what its ``stall`` and ``resumed`` lines share."""

    since: float  # monotonic: tells this idle time from a later one
    began: float  # wall clock
    after: dict[str, Any] | None  # the stage that ended before it: stage, step, rank
    thread: int | None  # that stage's thread (the training loop's), None before any stage
    seconds: float
    how: str


class IdleWatch:
    """The process's idle time and its deadline (see the module docstring); the hooks
    call :meth:`busy` and :meth:`idle`, the monitor :meth:`deadline`, :meth:`due` and
    :meth:`settle`, all under the table's lock.  The hooks only store: the monitor works
    the deadline out."""

    __slots__ = (
        "_longest",
        "fired",
        "first_s",
        "fixed",
        "floor_s",
        "multiple",
        "on",
        "postponed",
        "since",
        "stage",
        "start_s",
        "step",
        "rank",
        "thread",
        "wall",
    )

    def __init__(
        self, fixed: float | None, start_s: float, first_s: float, floor_s: float, multiple: float, on: bool
    ) -> None:
        self.fixed, self.start_s, self.first_s, self.floor_s, self.multiple = fixed, start_s, first_s, floor_s, multiple
        self.on = on
        self._longest: dict[str, float] = {}  # the stage before a gap -> the longest such gap
        self.fired: Idle | None = None
        self.since: float | None = time.monotonic()  # None while a stage is open
        self.wall = time.time()
        self.postponed = -math.inf  # monotonic: the deadline set again while the run progressed
        # The stage that ended before the idle time (None: the process has begun none).
        self.stage: str | None = None
        self.step: int | None = None
        self.rank = 0
        self.thread = 0

    def _seconds(self) -> tuple[float, str]:
        """The deadline of the idle time that follows ``stage`` (see the module docstring)."""
        if self.fixed is not None:
            return self.fixed, "fixed"
        if self.stage is None:
            return self.start_s, "start"
        longest = self._longest.get(self.stage)
        if longest is None:
            return self.first_s, "first"
        return max(self.floor_s, self.multiple * longest), "adaptive"

    def busy(self, now: float) -> Idle | None:
        """A stage begins and none was open: the idle time ends.  Returns it when its
        deadline had passed (its ``resumed`` line is due), else learns how long it was."""
        fired, since, before = self.fired, self.since, self.stage
        if fired is None and since is not None and before is not None and now - since > self._longest.get(before, 0):
            self._longest[before] = now - since
        self.since = self.fired = None
        return fired

    def idle(self, now: float, wall: float, stage: str, step: int | None, rank: int, thread: int) -> None:
        """The last open stage ended: an idle time begins."""
        self.since, self.wall, self.fired, self.postponed = now, wall, None, -math.inf
        self.stage, self.step, self.rank, self.thread = stage, step, rank, thread

    def deadline(self) -> float:
        """When the idle time's deadline passes (monotonic); inf while a stage is open,
        once it was reported, or with no stall deadline."""
        if self.since is None or self.fired is not None or not self.on:
            return math.inf
        return max(self.since + self._seconds()[0], self.postponed)

    def due(self, now: float) -> Idle | None:
        """The idle time, when its deadline passed and it was not reported yet."""
        if self.deadline() > now:
            return None
        assert self.since is not None
        seconds, how = self._seconds()
        after = None if self.stage is None else {"stage": self.stage, "step": self.step, "rank": self.rank}
        return Idle(self.since, self.wall, after, None if self.stage is None else self.thread, seconds, how)

    def settle(self, idle: Idle, progress_for: float | None, now: float) -> Idle | None:
        """After :meth:`due` and a look at the run (``progress_for``: how many seconds more
        it shows progress, or None): ``idle`` marked reported and returned, or, while the run
        progresses, its deadline set to when that ends; None too when a stage began meanwhile."""
        if self.since != idle.since or self.fired is not None:
            return None
        if progress_for is not None:
            self.postponed = now + progress_for
            return None
        self.fired = idle
        return idle


def run_progress(save_path: Path, window: float, host: str, pid: int) -> tuple[str, float] | None:
    """What shows that the run makes progress, in words, and until when (Unix seconds) it
    shows it; None when nothing does.  Progress is a rank of another process writing
    heartbeats under ``save_path`` with a stage open that has not passed its deadline (until
    it would), or that crossed a stage boundary within the last ``window`` seconds (until
    ``window`` after).  A heartbeat of another host may be behind or ahead by its clock: it
    is allowed :data:`CLOCK_SKEW_S`; one that stopped beating shows no open stage."""
    now = time.time()
    found: tuple[str, float] | None = None
    for path in heartbeat_files(save_path):
        try:
            beat = read_heartbeat(path)
        except (NotAHeartbeat, OSError, ValueError, TypeError):
            continue
        if beat.pid == pid and beat.host == host:
            continue  # this process's own ranks: its idle time is what is judged
        skew = 0.0 if beat.host == host else CLOCK_SKEW_S
        beats = finite_number(beat.liveness_s) or 2.0
        alive = not beat.closed and now - beat.time <= 3 * beats + 1.0 + skew
        evidence = []
        for item in beat.open if alive and isinstance(beat.open, list) else ():
            if isinstance(item, dict) and not item.get("passed"):
                since, deadline = finite_number(item.get("since")), finite_number(item.get("deadline_s"))
                ends = since + deadline if since is not None and deadline is not None else now + window
                evidence.append((f"is inside {item.get('stage')} (step {item.get('step')})", ends + skew))
        for point in (beat.last_begun, beat.last_ended):
            when = finite_number(point.get("time")) if isinstance(point, dict) else None
            if when is not None and now - when < window + skew:
                evidence.append((f"crossed a stage boundary {max(0.0, now - when):.0f} s ago", when + window + skew))
        for what, until in evidence:
            if until > now and (found is None or until > found[1]):
                found = (f"{rank_name(beat.rank)} {what}", until)
    return found


def report_stall(monitor: Any, idle: Idle, ranks: list[int]) -> None:
    """The idle deadline of ``monitor``'s process passed: the report, the ``stall`` line, the
    WARNING.  ``ranks``: those the process ran stages for."""
    stacks = thread_stacks()
    wanted = idle.thread if idle.thread is not None else threading.main_thread().ident
    mine = next((s for s in stacks if s.ident == wanted), None)
    where = None if mine is None else mine.user_frame()
    waiting_in = None if mine is None else mine.waiting_in() or mine.waiting_on_ray()
    report = new_stall_report_path(report_dir(monitor.save_path), monitor.pid)
    record = _record(
        monitor,
        "stall",
        idle,
        ranks,
        process=_command_line(),
        thread=None if mine is None else mine.name,
        where=where,
        waiting_in=waiting_in,
        report=report.relative_to(monitor.save_path).as_posix(),
    )
    try:
        report.write_text(_report_text(record, stacks, wanted), encoding="utf-8")
    except OSError as exc:
        logger.error("the watchdog cannot write its stall report %s: %s", report, exc)
        record = replace(record, report=None)
    _append(monitor.save_path, record)
    shown = describe_where(where)
    logger.warning(
        "%s: no stage began for %.1f s %s, past the deadline of %.1f s (%s); %s%s; report: %s",
        _process(record),
        record.elapsed_s,
        _since(record.after),
        idle.seconds,
        idle.how,
        f"{record.thread} at {shown}" if shown else "no user frame in its thread",
        f", waiting in {waiting_in}" if waiting_in else "",
        record.report or "not written",
    )


def report_resumed(monitor: Any, idle: Idle, ranks: list[int], next: dict[str, Any] | None, how: str | None) -> None:
    """The idle time of a reported stall ended: a stage began (``next``), or the process ends (``how``)."""
    record = _record(monitor, "resumed", idle, ranks, next=next, how=how)
    _append(monitor.save_path, record)
    then = f"{next['stage']} (step {next['step']}) began" if next is not None else f"the process ended ({how})"
    logger.warning("%s: %s after %.1f s with no stage open", _process(record), then, record.elapsed_s)


def _record(monitor: Any, kind: str, idle: Idle, ranks: list[int], **found: Any) -> StallRecord:
    """The ``stalls.jsonl`` line of ``idle``: what both kinds say of it, and ``found``."""
    now = time.time()
    return StallRecord(
        kind=kind,
        run=monitor.run() if ranks else run_id(),  # before the first stage: not cached, it may change
        time=now,
        pid=monitor.pid,
        host=monitor.host,
        ranks=ranks or _environment_rank(),
        after=idle.after,
        began=idle.began,
        elapsed_s=round(max(0.0, now - idle.began), 3),
        deadline_s=idle.seconds,
        deadline=idle.how,
        **found,
    )


def _append(save_path: Path, record: StallRecord) -> None:
    try:
        append_line(stalls_log_path(save_path), record.to_json())
    except OSError as exc:
        logger.error("the watchdog cannot append to %s: %s", stalls_log_path(save_path), exc)


def _command_line() -> str | None:
    """This process's command line as ``ps`` shows it (Ray retitles an actor's process by
    the task it runs), at most 200 characters; None where ``/proc`` has none."""
    try:
        with open("/proc/self/cmdline", "rb") as file:
            words = file.read(4096).split(b"\0")
    except OSError:
        return None
    text = " ".join(word.decode(errors="replace") for word in words if word).strip()
    return text[:200] or None


def _environment_rank() -> list[int]:
    """The rank a launcher gave the process (``RANK``), before it ran any stage."""
    value = os.environ.get("RANK", "")
    return [int(value)] if value.isdigit() else []


def _process(record: StallRecord) -> str:
    named = [rank_name(rank) for rank in record.ranks] or ([record.process] if record.process else [])
    return f"process {record.pid}" + (f" ({', '.join(named)})" if named else "")


def _since(after: dict[str, Any] | None) -> str:
    if after is None:
        return "since the watchdog was installed (before this process's first stage)"
    return f"after {after['stage']} (step {after['step']}, {rank_name(after['rank'])}) ended"


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _report_text(record: StallRecord, stacks: list[ThreadStack], thread: int | None) -> str:
    how = {
        "fixed": "stall_s",
        "start": "start_s: before the process's first stage",
        "first": "first_s: the first such gap in this process",
        "adaptive": "a multiple of the longest such gap so far, at least floor_s",
    }[record.deadline]
    lines = [
        "verl-events watchdog: a process made no progress (no stage open) past its deadline",
        f"run: {record.run}",
        f"{_process(record)} on {record.host}",
        f"no stage began for {record.elapsed_s:.1f} s {_since(record.after)}, since {_iso(record.began)}; "
        f"deadline {record.deadline_s:g} s ({how})",
        f"user code: {describe_where(record.where) or 'none in that thread (every frame is a library)'}",
        f"waiting in: {record.waiting_in or 'no torch.distributed call'}",
        "No rank sharing its save_path had a stage open within its deadline, nor crossed a stage boundary "
        "within this deadline, when it passed.",
        "",
        "Stacks, outermost frame first; '>>' marks each thread's innermost frame of user code.",
    ]
    for stack in stacks:
        mark = " (its last stage's thread)" if stack.ident == thread and record.after else ""
        mark = mark or (" (the main thread)" if stack.ident == thread else "")
        lines += ["", f"Thread {stack.name}{mark}:", *stack.render()]
    return "\n".join(lines) + "\n"
