"""How a watched process ends: a stage that raised, a terminating signal, a fatal one.

While the watchdog is installed:

* **a stage that raises**: :meth:`Endings.exception` appends a
  :class:`~.crash.CrashRecord` (type, message, the innermost user frame,
  the formatted traceback) when the exception leaves the innermost stage;
  the enclosing stages that the same exception leaves are not recorded again;
* **SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL**: :mod:`faulthandler` writes
  every thread's stack into ``crashes/pid{P}.fatal.txt``, renamed
  ``rank{R}.fatal.txt`` once the process's first stage names its rank; the
  previous faulthandler state is restored at close;
* **SIGTERM, SIGINT, SIGHUP**: a ``signal`` record (the time, the open
  stages), then the handler that was there before runs, so the process ends
  exactly as it would have: a Python handler (the user's, Ray's, Python's
  KeyboardInterrupt) is called; the default action is taken by restoring it
  and sending the signal again, after the rank's last heartbeat is written
  as closed; an ignored signal stays ignored.  Handlers are set only from
  the main thread (Python's rule); a handler set by C code, which Python
  cannot call, is left alone.

A process killed with SIGKILL writes nothing: its heartbeat, rewritten every
``liveness_s`` while it lives, stops (:mod:`.monitor`).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any

from verl_events import StageEnd
from verl_events.frames import user_frame_of_traceback

from .._lines import append_line
from .crash import CrashRecord, crash_log_path, fatal_path
from .monitor import WatchTable

__all__ = ["TERMINATING_SIGNALS", "Endings"]

logger = logging.getLogger("verl_events.watchdog")

#: The signals recorded before their previous handler runs.
TERMINATING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))
_TRACEBACK_LIMIT = 20000  # characters of a formatted traceback a record keeps
_LOCK_WAIT_S = 0.5  # a signal handler runs on the main thread, which may hold the table's lock


def _frames_of(frames: list[tuple[FrameType, int]]) -> list[tuple[str, str, int, str, str]]:
    """(module, file, line, function, code) of (frame, line) pairs, outermost first."""
    import linecache

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
        run: Callable[[], str | None],
        final_beat: Callable[[dict[str, Any]], None],
    ) -> None:
        self.table = table
        self.save_path = save_path
        self.host = host
        self.pid = os.getpid()
        self._run = run
        self._final_beat = final_beat
        self._fatal: IO[str] | None = None
        self._fatal_path: Path | None = None
        self._fatal_was_on = False
        self._rank_named = False
        self._previous: dict[int, Any] = {}
        self._signal: str | None = None  # the last terminating signal recorded
        self._last_error: tuple[int, int, int] | None = None  # (id, depth, thread) of the last recorded exception

    # -- start and stop ------------------------------------------------------------

    def start(self) -> None:
        self._fatal_was_on = faulthandler.is_enabled()
        self._fatal_path = fatal_path(self.save_path, pid=self.pid)
        try:
            self._fatal = open(self._fatal_path, "w", encoding="utf-8")  # kept open: faulthandler writes to it
            faulthandler.enable(self._fatal, all_threads=True)
        except OSError as exc:
            logger.error("the watchdog cannot open %s for fatal-signal stacks: %s", self._fatal_path, exc)
            self._fatal = None
        if threading.current_thread() is not threading.main_thread():
            logger.info("the watchdog was installed off the main thread: SIGTERM, SIGINT and SIGHUP go unrecorded")
            return
        for number in TERMINATING_SIGNALS:
            previous = signal.getsignal(number)
            if previous is None:  # set from C: Python cannot call it, so it cannot be chained
                continue
            signal.signal(number, self._on_signal)
            self._previous[number] = previous

    def name_rank(self, rank: int) -> None:
        """The process's first rank is known: its fatal dump takes the rank's name,
        unless another process of this rank already left one there."""
        if self._rank_named or self._fatal_path is None:
            return
        self._rank_named = True
        target = fatal_path(self.save_path, rank=rank)
        try:
            if target.exists() and target.stat().st_size > 0:
                return
            os.replace(self._fatal_path, target)
            self._fatal_path = target
        except OSError as exc:
            logger.error("the watchdog cannot rename %s to %s: %s", self._fatal_path, target, exc)

    def stop(self) -> None:
        """Put back the signal handlers (where ours is still set) and faulthandler's state;
        remove the fatal dump if nothing was written to it."""
        if threading.current_thread() is threading.main_thread():
            for number, previous in self._previous.items():
                if signal.getsignal(number) == self._on_signal:
                    signal.signal(number, previous)
        self._previous.clear()
        if self._fatal is None:
            return
        faulthandler.disable()
        if self._fatal_was_on:
            try:
                faulthandler.enable(sys.__stderr__, all_threads=True)
            except (AttributeError, OSError, ValueError):  # no usable stderr
                pass
        self._fatal.close()
        self._fatal = None
        try:
            if self._fatal_path is not None and self._fatal_path.stat().st_size == 0:
                self._fatal_path.unlink()
        except OSError:
            pass

    def exit_how(self) -> dict[str, Any]:
        """How the process is ending, for its last heartbeat: a recorded signal, the exception
        being handled or left uncaught, else a normal exit."""
        if self._signal is not None:
            return {"how": "signal", "detail": self._signal}
        error = sys.exc_info()[1] or getattr(sys, "last_value", None)
        if error is not None and not isinstance(error, SystemExit):
            return {"how": "exception", "detail": f"{type(error).__name__}: {error}"[:500]}
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
            message = str(error)
        except Exception as exc:
            message = f"<str() of the exception failed: {type(exc).__name__}>"
        self._append(
            CrashRecord(
                kind="exception",
                run=self._run(),
                time=time.time(),
                rank=event.rank,
                pid=self.pid,
                host=self.host,
                step=event.step,
                stage=event.stage,
                role=event.role,
                error_type=type(error).__name__,
                message=message[:_TRACEBACK_LIMIT],
                where=user_frame_of_traceback(frames),
                traceback=text[-_TRACEBACK_LIMIT:],
            )
        )

    # -- a terminating signal --------------------------------------------------------

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        self._signal = name
        try:
            self._record_signal(name, frame)
        except Exception:  # the previous handler runs whatever happened here
            logger.exception("the watchdog could not record %s", name)
        previous = self._previous.get(number, signal.SIG_DFL)
        if callable(previous):
            previous(number, frame)
        elif previous == signal.SIG_DFL:
            try:
                self._final_beat({"how": "signal", "detail": name})
            except Exception:
                logger.exception("the watchdog could not write the last heartbeat at %s", name)
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)  # ends the process as it would have ended without us

    def _record_signal(self, name: str, frame: FrameType | None) -> None:
        locked = self.table.lock.acquire(timeout=_LOCK_WAIT_S)
        try:
            opened = sorted(self.table.open.values(), key=lambda e: e.begun)
            ranks = sorted({e.event.rank for e in opened} | set(self.table.ranks))
        finally:
            if locked:
                self.table.lock.release()
        frames = _frames_of(list(traceback.walk_stack(frame))[::-1]) if frame is not None else []
        where = user_frame_of_traceback(frames)
        now = time.time()
        for rank in ranks or [None]:
            mine = [e for e in opened if e.event.rank == rank]
            inner = mine[-1].event if mine else None
            self._append(
                CrashRecord(
                    kind="signal",
                    run=self._run(),
                    time=now,
                    rank=-1 if rank is None else rank,
                    pid=self.pid,
                    host=self.host,
                    step=None if inner is None else inner.step,
                    stage=None if inner is None else inner.stage,
                    role=None if inner is None else inner.role,
                    where=where,
                    signal=name,
                    open=[{"stage": e.event.stage, "step": e.event.step, "since": e.since} for e in mine],
                )
            )

    def _append(self, record: CrashRecord) -> None:
        path = crash_log_path(self.save_path, record.rank) if record.rank >= 0 else None
        if path is None:  # no stage ran yet: no rank to file it under
            logger.warning("%s arrived before any stage ran; nothing recorded", record.signal)
            return
        try:
            append_line(path, record.to_json())
        except OSError as exc:
            logger.error("the watchdog cannot append to %s: %s", path, exc)
