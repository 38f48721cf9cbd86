"""How a watched process ends: a stage that raised, a terminating signal, a fatal one.

While the watchdog is installed:

* **a stage that raises**: :meth:`Endings.exception` appends a
  :class:`~.crash.CrashRecord` (type, message, the innermost user frame,
  the formatted traceback) when the exception leaves the innermost stage;
  the enclosing stages that the same exception leaves are not recorded again;
* **SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL**: :mod:`faulthandler` writes
  every thread's stack into ``crashes/rank{R}.fatal.txt``, from the
  process's first stage on (once a heartbeat names its rank); the previous
  faulthandler state is restored at close;
* **SIGTERM, SIGINT, SIGHUP**, so that the process ends exactly as it would
  have without us:

  - left to the default action (end the process): faulthandler's C handler
    writes the stack of the thread that takes the signal (the kernel's
    choice; the main thread when it can take it) into
    ``crashes/rank{R}.SIGTERM.txt``, then the default action ends the
    process.  One thread only: walking every thread from a signal handler
    crashes when a thread exits meanwhile (measured: a SIGTERM sent by a
    thread that then ended killed the process by SIGSEGV in 5 runs of 8 on
    a loaded machine), and a process must end by the signal it got.  A
    Python handler would not do:
    it runs only when the main thread comes back to Python, and a rank
    blocked in a collective would no longer die of SIGTERM;
  - with a Python handler (the user's, Ray's, Python's KeyboardInterrupt for
    SIGINT): ours writes a ``signal`` record (the time, the open stages,
    the main thread's line), then calls it; it is put back at close unless
    someone replaced ours since;
  - ignored, or set by C code (which Python cannot chain): left alone.

  Python handlers are set only from the main thread (Python's rule).

Every process, with ranks or none (verl's driver), appends how it ended to
``crashes/ends.jsonl`` at close or at a chained signal; one with no rank only
once a stage of its run has claimed the save_path (``run.json``): an
installation writes nothing before its run's claim.  A process killed
with SIGKILL writes nothing: its heartbeat, beating every ``liveness_s``
while it lives, stops (:mod:`.monitor`).
"""

from __future__ import annotations

import faulthandler
import linecache
import logging
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any

from verl_events import StageEnd, stage_header
from verl_events.frames import user_frame_of_traceback
from verl_events.layout import owner_of

from .._lines import append_line
from .crash import FATAL, CrashRecord, ProcessEnd, crash_log_path, ends_log_path, fatal_path
from .table import WatchTable

__all__ = ["TERMINATING_SIGNALS", "Endings"]

logger = logging.getLogger("verl_events.watchdog")

#: The signals recorded before their previous handler runs.
TERMINATING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))
_TRACEBACK_LIMIT = 20000  # characters of a formatted traceback a record keeps
_LOCK_WAIT_S = 0.5  # a signal handler runs on the main thread, which may hold the table's lock
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _plain(text: str) -> str:
    """``text`` without terminal colour codes (Ray colours the errors it forwards)."""
    return _ANSI.sub("", text)


def _frames_of(frames: list[tuple[FrameType, int]]) -> list[tuple[str, str, int, str, str]]:
    """(module, file, line, function, code) of (frame, line) pairs, outermost first."""
    return [
        (
            str(frame.f_globals.get("__name__", "")),
            frame.f_code.co_filename,
            line,
            frame.f_code.co_name,
            linecache.getline(frame.f_code.co_filename, line).strip(),
        )
        for frame, line in frames
    ]


class Endings:
    """The watchdog's records of how its process ends (see the module docstring).

    ``final_beat(exit)`` writes every rank's heartbeat as closed, with how
    the process ended; ``run()`` the run's id.
    """

    def __init__(
        self,
        table: WatchTable,
        save_path: Path,
        host: str,
        run: Callable[[], str],
        final_beat: Callable[[dict[str, Any]], None],
    ) -> None:
        self.table = table
        self.save_path = save_path
        self.host = host
        self.pid = os.getpid()
        self._run = run
        self._final_beat = final_beat
        self._dumps: dict[str, tuple[IO[str], Path]] = {}  # "fatal" or a signal's name -> its dump file
        self._fatal_was_on = False
        self._ended = False
        self._previous: dict[int, Any] = {}
        self._signal: str | None = None  # the terminating signal the process is ending by
        self._closed = False  # after stop(): our handler, if someone chained to it, only passes signals on
        self._earlier_error = getattr(sys, "last_value", None)  # an interactive session's, before us
        self._last_error: tuple[int, int, int] | None = None  # (id, depth, thread) of the last recorded exception

    # -- start and stop ------------------------------------------------------------

    def start(self) -> None:
        """At install, on the thread that installs: chain the Python handlers there already."""
        main = threading.current_thread() is threading.main_thread()
        for number in TERMINATING_SIGNALS:
            previous = signal.getsignal(number)
            if callable(previous) and main:
                signal.signal(number, self._on_signal)
                self._previous[number] = previous
            elif callable(previous):
                logger.info("the watchdog was installed off the main thread: %s goes unrecorded", number)

    def arm(self, rank: int) -> None:
        """The process's first stage named its rank (the monitor's first heartbeat, within
        ``heartbeat_s``): from now on faulthandler writes its dumps under that rank.  A
        process that runs no stage (verl's driver, a reward worker) leaves none."""
        if self._dumps:
            return
        self._fatal_was_on = faulthandler.is_enabled()
        fatal = self._open_dump(rank, FATAL)
        if fatal is not None:
            faulthandler.enable(fatal, all_threads=True)
        for number in TERMINATING_SIGNALS:
            if signal.getsignal(number) == signal.SIG_DFL and hasattr(faulthandler, "register"):
                dump = self._open_dump(rank, signal.Signals(number).name)
                if dump is not None:
                    # all_threads=False: see the module docstring (a thread exiting during the walk).
                    faulthandler.register(number, dump, all_threads=False, chain=True)

    def _open_dump(self, rank: int, kind: str) -> IO[str] | None:
        path = fatal_path(self.save_path, rank=rank, signal=kind)
        try:
            # Appended to: an earlier process of this run at this rank may have left its dump there.
            dump = open(path, "a", encoding="utf-8")  # kept open: faulthandler writes to it from a signal handler
        except OSError as exc:
            logger.error("the watchdog cannot open %s for the stacks at %s: %s", path, kind, exc)
            return None
        self._dumps[kind] = (dump, path)
        return dump

    def stop(self, exit: dict[str, Any]) -> None:
        """Record how the process ends (``exit``); put back the signal handlers (where ours is
        still set) and faulthandler's state; remove the dumps nothing was written to."""
        self._end(exit)
        self._closed = True
        if threading.current_thread() is threading.main_thread():
            for number, previous in list(self._previous.items()):
                if signal.getsignal(number) == self._on_signal:
                    signal.signal(number, previous)
                    del self._previous[number]
        # A handler set after ours may call ours: it still passes the signal on (``_previous`` kept).
        for number in TERMINATING_SIGNALS:
            # A Python handler set since replaced faulthandler's; unregistering would put back the default.
            if signal.Signals(number).name in self._dumps and signal.getsignal(number) == signal.SIG_DFL:
                faulthandler.unregister(number)
        if FATAL in self._dumps:
            faulthandler.disable()
            if self._fatal_was_on and sys.__stderr__ is not None:
                try:
                    faulthandler.enable(sys.__stderr__, all_threads=True)
                except (AttributeError, OSError, ValueError):  # no usable stderr
                    pass
        for dump, path in self._dumps.values():
            dump.close()
            try:
                if path.stat().st_size == 0:
                    path.unlink()
            except OSError:
                pass
        self._dumps.clear()

    def _end(self, exit: dict[str, Any]) -> None:
        """One line in ``crashes/ends.jsonl``: how this process ended, with the ranks it ran.
        A process without ranks (verl's driver) says so too: its normal end tells the
        launcher's SIGTERMs that follow from a failure's."""
        if self._ended:
            return
        self._ended = True
        locked = self.table.lock.acquire(timeout=_LOCK_WAIT_S)
        try:
            ranks = sorted(self.table.ranks)
        finally:
            if locked:
                self.table.lock.release()
        if not ranks and owner_of(self.save_path) != self._run():
            return  # no stage of this run has claimed the save_path yet: writing would be its first file
        end = ProcessEnd(run=self._run(), time=time.time(), pid=self.pid, host=self.host, ranks=ranks, **exit)
        try:
            append_line(ends_log_path(self.save_path), end.to_json())
        except OSError as exc:
            logger.error("the watchdog cannot append to %s: %s", ends_log_path(self.save_path), exc)

    def aborted(self, exit: dict[str, Any]) -> None:
        """The monitor ends the process (``action: abort``): its line in ``ends.jsonl`` says so."""
        self._end(exit)

    def exit_how(self) -> dict[str, Any]:
        """How the process is ending, for its last heartbeat: a recorded signal, the exception
        being handled or left uncaught, else a normal exit."""
        if self._signal is not None:
            return {"how": "signal", "detail": self._signal}
        last = getattr(sys, "last_value", None)
        error = sys.exc_info()[1] or (last if last is not self._earlier_error else None)
        if isinstance(error, SystemExit) and error.code in (None, 0):
            error = None  # sys.exit() and sys.exit(0) are a normal end
        if error is not None:
            return {"how": "exception", "detail": _plain(f"{type(error).__name__}: {error}")[:500]}
        return {"how": "normal", "detail": None}

    # -- a stage raised -------------------------------------------------------------

    def exception(self, event: StageEnd) -> None:
        """Record ``event.error`` unless an inner stage of this thread recorded it already."""
        error = event.error
        assert error is not None
        key = (id(error), event.depth, threading.get_ident())
        last = self._last_error
        if last is not None and last[0] == key[0] and last[2] == key[2] and key[1] < last[1]:
            return  # the same exception leaving an enclosing stage
        self._last_error = key
        frames = _frames_of(list(traceback.walk_tb(error.__traceback__)))
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        try:
            message = _plain(str(error))
        except Exception as exc:
            message = f"<str() of the exception failed: {type(exc).__name__}>"
        self._append(
            CrashRecord(
                **stage_header(event, self._run),
                kind="exception",
                pid=self.pid,
                host=self.host,
                role=event.role,
                parent=event.parent,
                error_type=type(error).__name__,
                message=message[:_TRACEBACK_LIMIT],
                where=user_frame_of_traceback(frames),
                traceback=text[-_TRACEBACK_LIMIT:],
            )
        )

    # -- a terminating signal --------------------------------------------------------

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        previous = self._previous.get(number)
        if self._closed:
            if callable(previous):
                previous(number, frame)
            return
        name = signal.Signals(number).name
        self._signal = name
        try:
            self._record_signal(name, frame)
            # The handler may end the process at once (Ray's does, with os._exit): say so now.
            self._final_beat({"how": "signal", "detail": name})
            self._end({"how": "signal", "detail": name})
        except Exception:  # the previous handler runs whatever happened here
            logger.exception("the watchdog could not record %s", name)
        if callable(previous):
            previous(number, frame)  # raises (KeyboardInterrupt, SystemExit) or ends the process, mostly
        # It returned: the process lives on (a handler that saves a checkpoint, then carries on).
        self._signal = None
        self._ended = False
        self._reopen()

    def _reopen(self) -> None:
        """The process went on after a signal: its heartbeats are rewritten open at the next beat."""
        locked = self.table.lock.acquire(timeout=_LOCK_WAIT_S)
        try:
            for state in self.table.ranks.values():
                state.changed = True
        finally:
            if locked:
                self.table.lock.release()

    def _record_signal(self, name: str, frame: FrameType | None) -> None:
        locked = self.table.lock.acquire(timeout=_LOCK_WAIT_S)
        try:
            opened = sorted(self.table.open.values(), key=lambda e: e.begun)
            ranks = sorted({e.event.rank for e in opened} | set(self.table.ranks))
        finally:
            if locked:
                self.table.lock.release()
        current = sys._current_frames()
        now = time.time()
        if not ranks:  # no stage ran: no rank to file it under (its end is in ends.jsonl)
            logger.debug("%s arrived before any stage ran", name)
        for rank in ranks:
            mine = [e for e in opened if e.event.rank == rank]
            inner = mine[-1].event if mine else None
            # The line: in the innermost open stage's thread (Ray runs actor tasks off the main
            # thread, where the handler runs), else where the handler interrupted the main thread.
            at = current.get(mine[-1].thread) if mine else frame
            where = user_frame_of_traceback(_frames_of(list(traceback.walk_stack(at))[::-1])) if at else None
            self._append(
                CrashRecord(
                    kind="signal",
                    run=self._run(),
                    time=now,
                    rank=rank,
                    pid=self.pid,
                    host=self.host,
                    step=None if inner is None else inner.step,
                    stage=None if inner is None else inner.stage,
                    role=None if inner is None else inner.role,
                    parent=None if inner is None else inner.parent,
                    where=where,
                    signal=name,
                    open=[{"stage": e.event.stage, "step": e.event.step, "since": e.since} for e in mine],
                )
            )

    def _append(self, record: CrashRecord) -> None:
        path = crash_log_path(self.save_path, record.rank)
        try:
            append_line(path, record.to_json())
        except OSError as exc:
            logger.error("the watchdog cannot append to %s: %s", path, exc)
