"""The watchdog: a deadline on every open stage, and a report when one passes.

Config::

    - name: watchdog
      # timeout_s: 900         # one fixed deadline for every stage; default: adaptive, below
      multiple: 5.0            # adaptive: 5 x the longest time this stage took so far in this process,
      floor_s: 120.0           #   never less than 120 s,
      first_s: 480.0           #   and 480 s the first time (compiling, warming up)
      stall_s: null            # no stage open for this long, and no rank progressing: a stall
                               #   (null: adaptive, as above; false: off)
      start_s: 1800.0          # adaptive: the deadline before a process's first stage
      heartbeat_s: 0.5         # how often, at most, each rank's heartbeat is rewritten when it changes
      liveness_s: 2.0          # and how often, at least, it beats (its mtime set) while the process lives
      action: report           # or abort: end the process with ABORT_EXIT_CODE after the report

The deadlines (:mod:`.monitor`): one monitor thread per watchdog, started at
install, holds the open stages' deadlines and wakes at the earliest one (or
every ``heartbeat_s`` to rewrite the heartbeats).  The hooks only put a stage
in that table and take it out: a few attribute reads and one lock, measured
by ``benchmarks/watchdog.py``.  A stage that ended after its deadline passed
does not teach the adaptive deadline: it is the kind of time the deadline is
there to catch.

A process with no stage open has a deadline too (:mod:`.stall`): from the
installation to its first stage, and between stages.  When it passes and no
rank sharing the save_path is making progress (a stage open, a boundary
crossed lately), a report with every thread's stack and a ``stall`` line in
``stalls.jsonl``; a ``resumed`` line when a stage begins again.  It is
reported, never aborted.

When a deadline passes, on that rank: one WARNING on ``verl_events.watchdog``,
a report (:func:`~.record.new_report_path`) with every thread's stack, one
:class:`~.record.HangRecord` line in ``hangs.jsonl``, the heartbeat rewritten
and the ``hang`` signal sent (``HangEvent``); with ``action: abort`` the
process then ends with :data:`ABORT_EXIT_CODE`.  When that stage ends after
all, a ``late`` line with its whole time.

How the process ends is recorded too (:mod:`.endings`, files owned by
:mod:`.crash`): a stage that raised, a terminating signal (then the
previous handler runs: the process ends as it would have), a fatal
signal's stacks (faulthandler), and the heartbeat's last word, ``closed``
with how it ended; a SIGKILL shows as a heartbeat that stopped beating.

Thread safety: hooks run on the stages' threads, the monitor on its own; both
take one lock around the table.  The watchdog is passive: a stage it watches
still counts as unprofiled.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from pathlib import Path
from typing import Literal

from verl_events import ConfigError, InstallContext, Observer, StageEnd, StageEvent, Writes, prepare_output_dir

from .boundary import BEGAN, ENDED, BoundaryWriter, boundary_path
from .crash import crash_dir
from .endings import Endings
from .monitor import ABORT_EXIT_CODE, Monitor, MonitorSettings
from .record import heartbeat_dir, heartbeat_path, report_dir, watchdog_files
from .stall import IdleWatch
from .table import OpenStage, RankState, WatchTable

__all__ = ["ABORT_EXIT_CODE", "WatchdogObserver"]

logger = logging.getLogger("verl_events.watchdog")

_monotonic = time.monotonic
_time = time.time
_get_ident = threading.get_ident


def _seconds(value: object, key: str, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"option {key}: {value!r} is not allowed; use {allowed}")
    return float(value)


class WatchdogObserver(Observer):
    """A deadline on every selected stage; a report, a log line, a record and
    the ``hang`` signal when one passes (see the module docstring)."""

    passive = True
    sees_driver = True  # a hang in generation is the driver's
    priority = 900  # outside the other observers (the timing observer is at 1000): their hooks count as the stage's
    writes = Writes("watchdog file(s)", watchdog_files, "hangs", "verl_events.apps.hangs.command")

    def __init__(
        self,
        timeout_s: float | None = None,
        multiple: float = 5.0,
        floor_s: float = 120.0,
        first_s: float = 480.0,
        heartbeat_s: float = 0.5,
        liveness_s: float = 2.0,
        action: Literal["report", "abort"] = "report",
        stall_s: float | bool | None = None,
        start_s: float = 1800.0,
    ) -> None:
        seconds = "a number of seconds > 0"
        self.timeout_s = None if timeout_s is None else _seconds(timeout_s, "timeout_s", f"{seconds}, or null")
        self.floor_s = _seconds(floor_s, "floor_s", seconds)
        self.first_s = _seconds(first_s, "first_s", seconds)
        self.heartbeat_s = _seconds(heartbeat_s, "heartbeat_s", seconds)
        self.liveness_s = _seconds(liveness_s, "liveness_s", seconds)
        if isinstance(multiple, bool) or not isinstance(multiple, (int, float)) or not 1 <= multiple < math.inf:
            raise ConfigError(f"option multiple: {multiple!r} is not allowed; use a number >= 1")
        self.multiple = float(multiple)
        if action not in ("report", "abort"):
            raise ConfigError(f"option action: {action!r} is not allowed; use 'report' or 'abort'")
        self.action = action
        if stall_s is not False and stall_s is not None:
            stall_s = _seconds(stall_s, "stall_s", f"{seconds}, null (adaptive) or false (no stall deadline)")
        self.stall_s = stall_s
        self.start_s = _seconds(start_s, "start_s", seconds)
        first = (self.timeout_s, "fixed") if self.timeout_s is not None else (self.first_s, "first")
        self._first = first
        self._deadlines: dict[str, tuple[float, str]] = {}  # stage -> (seconds, how it was set)
        self._longest: dict[str, float] = {}
        self._table = WatchTable()
        # The hooks' own names for the table's parts: no extra attribute lookup on the hot path.
        self._lock = self._table.lock
        self._open: dict[int, OpenStage] = self._table.open
        self._ranks: dict[int, RankState] = self._table.ranks
        self._monitor: Monitor | None = None
        self._endings: Endings | None = None
        self._save_path: Path | None = None
        self._idle: IdleWatch | None = None

    def outputs(self, save_path: Path) -> list[Path]:
        """The heartbeats, the hang reports, hangs.jsonl and the crash records under ``save_path``;
        not the stalls' files, which a process may write before its first stage (and its claim)."""
        return watchdog_files(save_path, stalls=False)

    def describe(self) -> str:
        if self.timeout_s is not None:
            deadline = f"deadline {self.timeout_s:g} s on every stage"
        else:
            deadline = (
                f"deadline {self.multiple:g} x the stage's longest so far, at least {self.floor_s:g} s "
                f"({self.first_s:g} s the first time)"
            )
        then = f"report, then exit {ABORT_EXIT_CODE}" if self.action == "abort" else "report"
        if self.stall_s is None or self.stall_s is False:
            stall = "no stall deadline" if self.stall_s is False else "stall deadline adaptive, as a stage's"
        else:
            stall = f"stall deadline {self.stall_s:g} s"
        return f"{deadline}; {stall}; on a hang: {then}"

    def setup(self, context: InstallContext) -> None:
        for folder in (heartbeat_dir(context.save_path), report_dir(context.save_path), crash_dir(context.save_path)):
            prepare_output_dir(folder)
        settings = MonitorSettings(
            heartbeat_s=self.heartbeat_s, liveness_s=self.liveness_s, action=self.action, multiple=self.multiple
        )
        host = socket.gethostname()
        self._save_path = context.save_path
        fixed = None if self.stall_s is None or self.stall_s is False else float(self.stall_s)
        self._idle = self._table.idle = IdleWatch(
            fixed, self.start_s, self.first_s, self.floor_s, self.multiple, on=self.stall_s is not False
        )
        monitor = self._monitor = Monitor(self._table, settings, context.save_path, host, context.run_id)
        endings = self._endings = Endings(self._table, context.save_path, host, monitor.run, monitor.final_beat)
        monitor.on_first_rank = endings.arm
        monitor.on_abort = endings.aborted
        endings.start()
        monitor.start()

    # -- the hooks: keep them to a few attribute reads (benchmarks/watchdog.py) --

    def on_stage_begin(self, event: StageEvent) -> None:
        seconds, how = self._deadlines.get(event.stage, self._first)
        now = _monotonic()
        entry = OpenStage(event, _get_ident(), now, _time(), now + seconds, seconds, how)
        resumed = None
        with self._lock:
            if not self._open and self._idle is not None:
                resumed = self._idle.busy(now)
            state = self._ranks.get(event.rank)
            if state is None:
                state = self._ranks[event.rank] = RankState(event.rank, boundary=self._boundary_of(event.rank))
            state.begun += 1
            entry.begun = state.begun
            state.last_begun = entry
            state.changed = True
            self._open[event.seq] = entry
            boundary = state.boundary
            if boundary is not None:
                boundary.store(BEGAN, event.stage, event.step, event.depth, state.begun, entry.since, entry.thread)
        if resumed is not None and self._monitor is not None:  # the stall it ends was reported
            self._monitor.resumed(resumed, {"stage": event.stage, "step": event.step, "rank": event.rank})

    def on_stage_end(self, event: StageEnd) -> None:
        ended = _time()
        with self._lock:
            entry = self._open.pop(event.seq, None)
            if entry is not None:
                state = self._ranks[event.rank]
                state.ended[event.stage] = (event.step, ended)
                state.last_ended = (event.stage, event.step, ended)
                state.changed = True
                if state.boundary is not None:
                    state.boundary.store(ENDED, event.stage, event.step, event.depth, state.begun, ended, entry.thread)
                if not self._open and self._idle is not None:
                    self._idle.idle(_monotonic(), ended, event.stage, event.step, event.rank, entry.thread)
        if event.error is not None and self._endings is not None:
            self._endings.exception(event)  # after the table: were this to fail, no stage is left open
        if entry is None:
            return
        if entry.fired:
            assert self._monitor is not None
            self._monitor.late(entry, event.elapsed_s)
        elif self.timeout_s is None and event.error is None and event.elapsed_s > self._longest.get(event.stage, 0.0):
            self._longest[event.stage] = event.elapsed_s
            self._deadlines[event.stage] = (max(self.floor_s, self.multiple * event.elapsed_s), "adaptive")

    def _boundary_of(self, rank: int) -> BoundaryWriter | None:
        """The rank's boundary record (:mod:`.boundary`), or None where it cannot be made:
        then the heartbeat alone says where the rank is."""
        assert self._save_path is not None
        try:
            return BoundaryWriter(boundary_path(heartbeat_path(self._save_path, rank)))
        except (OSError, ValueError) as exc:
            logger.warning("the watchdog keeps no boundary record of rank %s: %s", rank, exc)
            return None

    def close(self) -> None:
        exit = self._endings.exit_how() if self._endings is not None else None
        if self._monitor is not None:
            self._monitor.stop(exit)
            self._monitor = None
        if self._endings is not None and exit is not None:
            self._endings.stop(exit)
            self._endings = None
        with self._lock:
            for state in self._ranks.values():
                if state.boundary is not None:
                    state.boundary.close()
                    state.boundary = None
