"""The watchdog's monitor thread: deadlines, reports and heartbeats.

One thread per watchdog.  It sleeps until the earliest open stage's
deadline, or ``heartbeat_s``, whichever comes first; then it rewrites the
heartbeat of every rank whose position changed (so at most once per
``heartbeat_s``, never from a hook), sets the file's mtime of every other
rank whose heartbeat is ``liveness_s`` old (the liveness beat, one ``os.utime``:
a rank whose heartbeat stops beating has stopped, a SIGKILL included), and
fires every stage whose deadline has passed: the report, the record, the log
line, the ``hang`` signal and, with ``action: abort``, :func:`os._exit` with
:data:`ABORT_EXIT_CODE`.  A new stage with a deadline earlier than the one the
thread sleeps on is seen at its next wake-up, at most ``heartbeat_s`` late.
With no stage open, it watches the process's idle time instead
(:mod:`.stall`): its report and its ``stall`` line when that deadline passes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events import HangEvent, StageEvent, hang, stage_header

from .._lines import append_line
from .record import (
    HangRecord,
    Heartbeat,
    hangs_log_path,
    new_report_path,
    process_start_time,
    touch_heartbeat,
    write_heartbeat,
)
from .report import report_text
from .stacks import collective_info, describe_where, thread_stacks
from .stall import Idle, report_resumed, report_stall, run_progress
from .table import OpenStage, RankState, WatchTable

__all__ = ["ABORT_EXIT_CODE", "Monitor", "MonitorSettings"]

#: The exit code of a process the watchdog ends (``action: abort``), as GNU timeout's.
ABORT_EXIT_CODE = 124

logger = logging.getLogger("verl_events.watchdog")


@dataclass(frozen=True, slots=True)
class MonitorSettings:
    """The watchdog's options the monitor reads."""

    heartbeat_s: float
    liveness_s: float
    action: str  # "report" or "abort"
    multiple: float  # the adaptive deadline's, for the report's wording


class Monitor:
    """The watchdog's thread (see the module docstring)."""

    def __init__(
        self, table: WatchTable, settings: MonitorSettings, save_path: Path, host: str, run: Callable[[], str]
    ) -> None:
        self.table = table
        self.settings = settings
        self.save_path = save_path
        self.host = host
        self.pid = os.getpid()
        self.started = process_start_time(self.pid)
        self.on_first_rank: Callable[[int], None] | None = None  # told the first rank the process runs
        self.on_abort: Callable[[dict[str, Any]], None] | None = None  # told how it ends, before os._exit
        self._first_rank_told = False
        self._stop = threading.Event()
        self._fire_lock = threading.Lock()  # a stage's late line waits for its hang line
        self.run = run  # the run id (the installation's: resolved at its first record)
        self._thread = threading.Thread(target=self._loop, name="verl-events-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, exit: dict[str, Any] | None = None) -> None:
        """Stop the thread and write every rank's last heartbeat, marked closed
        (``exit``: how the process ends)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        idle = self.table.idle
        if idle is not None and idle.fired is not None and idle.since is not None:
            self.resumed(idle.fired, None, (exit or {}).get("how", "unknown"))
        self._beat(closed=True, exit=exit)

    def resumed(self, idle: Idle, next: dict[str, Any] | None, how: str | None = None) -> None:
        """The idle time of a reported stall ended: its ``resumed`` line, after its ``stall`` line."""
        with self._fire_lock:
            report_resumed(self, idle, sorted(self.table.ranks), next, how)

    # -- the loop --------------------------------------------------------------

    def _loop(self) -> None:
        interval = self.settings.heartbeat_s
        wait = interval
        while not self._stop.wait(wait):
            try:
                wait = self._tick(interval)
            except Exception:  # the watchdog must outlive its own failures
                logger.exception("the watchdog's monitor failed; it goes on")
                wait = interval

    def _tick(self, interval: float) -> float:
        table = self.table
        now = time.monotonic()
        earliest = now + interval
        self._stall(now)
        due = []
        with table.lock:
            if table.idle is not None:
                earliest = min(earliest, table.idle.deadline())
            for entry in table.open.values():
                if entry.fired:
                    continue
                if entry.deadline <= now:
                    entry.fired = True
                    due.append(entry)
                elif entry.deadline < earliest:
                    earliest = entry.deadline
            if due:  # taken before the table is let go: a late line always follows its hang line
                self._fire_lock.acquire()
        if due:
            try:
                for entry in due:
                    self._fire(entry, now)
            finally:
                self._fire_lock.release()
        self._beat()
        return max(0.01, earliest - time.monotonic())

    def _stall(self, now: float) -> None:
        """Report the process's idle time when its deadline passed and the run shows no
        progress (:func:`~.stall.run_progress`, read outside the lock: it reads the heartbeats)."""
        idle = self.table.idle
        if idle is None:
            return
        with self.table.lock:
            candidate = None if self.table.open else idle.due(now)
        if candidate is None:
            return
        progress = run_progress(self.save_path, candidate.seconds, self.host, self.pid)
        progress_for = None if progress is None else max(0.0, progress[1] - time.time())
        with self.table.lock:
            stalled = idle.settle(candidate, progress_for, time.monotonic())
            ranks = sorted(self.table.ranks)
            if stalled is not None:  # taken before the table is let go: its resumed line waits for it
                self._fire_lock.acquire()
        if stalled is not None:
            try:
                report_stall(self, stalled, ranks)
            finally:
                self._fire_lock.release()

    def final_beat(self, exit: dict[str, Any]) -> None:
        """Every rank's heartbeat, closed, from a signal handler: the main thread it runs
        on may hold the table's lock, so the lock is waited for only briefly."""
        self._beat(closed=True, exit=exit, lock_wait_s=0.5)

    # -- heartbeats --------------------------------------------------------------

    def _beat(
        self,
        *,
        closed: bool = False,
        force: bool = False,
        exit: dict[str, Any] | None = None,
        lock_wait_s: float = -1,
    ) -> None:
        table = self.table
        now = time.monotonic()
        locked = table.lock.acquire(timeout=lock_wait_s)
        try:
            rewrite, beats, touched = closed or force, [], []
            for state in table.ranks.values():
                if not (rewrite or state.changed or now - state.written >= self.settings.liveness_s):
                    continue
                if rewrite or state.changed or not state.on_disk:
                    beats.append((state, self._heartbeat(state, closed, exit)))
                else:  # nothing changed and its file is current: the liveness beat sets its mtime
                    touched.append(state)
                state.changed, state.written = False, now
        finally:
            if locked:
                table.lock.release()
        if beats and not self._first_rank_told and self.on_first_rank is not None:
            self._first_rank_told = True
            self.on_first_rank(beats[0][0].rank)
        for state in touched:
            try:
                touch_heartbeat(self.save_path, state.rank, time.time())
            except OSError:  # the file went away: rewrite it whole
                with table.lock:
                    beats.append((state, self._heartbeat(state, False, None)))
        for state, beat in beats:
            state.on_disk = False
            try:
                write_heartbeat(self.save_path, beat)
                state.on_disk = not closed
            except OSError as exc:
                logger.error(
                    "the watchdog cannot write rank %s's heartbeat under %s: %s", beat.rank, self.save_path, exc
                )

    def _heartbeat(self, state: RankState, closed: bool, exit: dict[str, Any] | None) -> Heartbeat:
        """A rank's heartbeat from the table; called with the table locked."""
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        opened = sorted((e for e in self.table.open.values() if e.event.rank == state.rank), key=lambda e: e.begun)
        last = state.last_begun
        return Heartbeat(
            run=self.run(),
            rank=state.rank,
            pid=self.pid,
            host=self.host,
            time=time.time(),
            begun=state.begun,
            open=[
                {
                    "stage": e.event.stage,
                    "step": e.event.step,
                    "since": e.since,
                    "begun": e.begun,
                    "thread": names.get(e.thread, str(e.thread)),
                    "thread_id": e.thread,  # as faulthandler's dumps name threads
                    "deadline_s": e.seconds,
                    "passed": e.fired,
                }
                for e in opened
            ],
            last_begun=None
            if last is None
            else {"stage": last.event.stage, "step": last.event.step, "time": last.since},
            last_ended=None
            if state.last_ended is None
            else dict(zip(("stage", "step", "time"), state.last_ended, strict=True)),
            ended={stage: {"step": step, "time": at} for stage, (step, at) in state.ended.items()},
            closed=closed,
            liveness_s=self.settings.liveness_s,
            started=self.started,
            exit=exit if closed else None,
            mtime_beats=True,
        )

    # -- a deadline passed ---------------------------------------------------------

    def _fire(self, entry: OpenStage, now: float) -> None:
        """Stage ``entry`` passed its deadline: its report and line, a warning, a beat, the
        ``hang`` signal, and with ``action: abort`` the end of this process."""
        event = entry.event
        elapsed = now - entry.started
        stacks = thread_stacks()
        mine = next((s for s in stacks if s.ident == entry.thread), None)
        where = None if mine is None else mine.user_frame()
        waiting_in = None if mine is None else mine.waiting_in()
        report: Path | None = new_report_path(self.save_path, event.step, event.stage, event.rank)
        assert report is not None
        record = self._record(
            "hang",
            entry,
            elapsed,
            thread=None if mine is None else mine.name,
            where=where,
            waiting_in=waiting_in,
            collective=collective_info(),
            report=report.relative_to(self.save_path).as_posix(),
        )
        try:
            report.write_text(report_text(record, stacks, entry, self.settings.multiple, ABORT_EXIT_CODE), "utf-8")
        except OSError as exc:
            logger.error("the watchdog cannot write its report %s: %s", report, exc)
            report = None
        self._append(record)
        shown = describe_where(where)
        logger.warning(
            "rank %s: stage %r (step %s) has run %.1f s, past its deadline of %.1f s (%s); %s%s; report: %s",
            event.rank,
            event.stage,
            event.step,
            elapsed,
            entry.seconds,
            entry.how,
            f"at {shown}" if shown else "no user frame in its thread",
            f", waiting in {waiting_in}" if waiting_in else "",
            report if report is not None else "not written",
        )
        self._beat(force=True)
        self._send_hang(entry, elapsed, where, report)
        if self.settings.action == "abort":
            self._abort(event)

    def _send_hang(self, entry: OpenStage, elapsed: float, where: dict[str, Any] | None, report: Path | None) -> None:
        """The ``hang`` signal, for the observers' ``on_hang``; a receiver's failure is logged."""
        event = entry.event
        at = None if where is None else f"{where['file']}:{where['line']} in {where['function']}"
        hang_event = HangEvent(
            event.step, event.stage, event.rank, elapsed, entry.seconds, at, None if report is None else str(report)
        )
        try:
            hang.send(event.stage, event=hang_event)
        except Exception:
            logger.exception("a receiver of the hang signal failed (stage %r, rank %s)", event.stage, event.rank)

    def _abort(self, event: StageEvent) -> None:
        """``action: abort``: end this process with :data:`ABORT_EXIT_CODE`, having said so first."""
        logger.warning(
            "rank %s: action abort: ending process %s with exit code %s", event.rank, self.pid, ABORT_EXIT_CODE
        )
        # Said before the exit, so that readers tell this end from a kill: the heartbeats
        # closed with how it ended, and the process's line in ends.jsonl.
        ending = {
            "how": "abort",
            "detail": f"exit code {ABORT_EXIT_CODE}: step {event.step}'s {event.stage} passed its deadline",
        }
        self._beat(closed=True, exit=ending, lock_wait_s=0.5)
        if self.on_abort is not None:
            try:
                self.on_abort(ending)
            except Exception:
                logger.exception("the watchdog could not record how it ends this process")
        for handler in logging.getLogger().handlers + logger.handlers:
            handler.flush()
        os._exit(ABORT_EXIT_CODE)

    def _record(self, kind: str, entry: OpenStage, elapsed_s: float, **found: Any) -> HangRecord:
        """The ``hangs.jsonl`` line of an open stage: what every kind of line
        says of it, and ``found`` (what a ``hang`` line adds: thread, where, ...)."""
        event = entry.event
        return HangRecord(
            **stage_header(event, self.run),
            kind=kind,
            role=event.role,
            pid=self.pid,
            host=self.host,
            began=entry.since,
            begun=entry.begun,
            elapsed_s=round(elapsed_s, 3),
            deadline_s=entry.seconds,
            deadline=entry.how,
            action=self.settings.action,
            **found,
        )

    def late(self, entry: OpenStage, elapsed_s: float) -> None:
        """A stage whose deadline had passed ended after all: its ``late`` line."""
        event = entry.event
        with self._fire_lock:
            record = self._record("late", entry, elapsed_s)
            self._append(record)
        logger.warning(
            "rank %s: stage %r (step %s) ended late after all, after %.1f s (its deadline: %.1f s)",
            event.rank,
            event.stage,
            event.step,
            elapsed_s,
            entry.seconds,
        )

    def _append(self, record: HangRecord) -> None:
        try:
            append_line(hangs_log_path(self.save_path), record.to_json())
        except OSError as exc:
            logger.error("the watchdog cannot append to %s: %s", hangs_log_path(self.save_path), exc)
