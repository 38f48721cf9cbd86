"""Timing observer: one JSON line per stage with its time, every observer's
overhead and the bytes dumped, so overhead and disk tables can be rebuilt
from disk alone.

Each rank appends to ``{save_path}/timing/rank{R}.jsonl``::

    {"run": "ray-session_…-01000000", "stage": "actor_update", "role": "actor", "step": 1, "rank": 0, "world_size": 2,
     "depth": 0, "parent": null, "elapsed_s": 0.41, "error": null,
     "observers": ["timing", "msprobe"], "profiled": true, "profiled_by": ["msprobe"], "enclosed_by": [],
     "hook_s": {"timing": 1.2e-05, "msprobe": 0.031}, "overhead_s": 0.031, "dump_bytes": 48213,
     "event": "stage", "timestamp": "2026-11-29T19:41:07.113Z"}

``run`` names the run (see :mod:`verl_events._run`): a save_path holding
another run's timing logs is refused, as msprobe's dumps are, so a log
never mixes runs.  ``end_unix`` is the wall clock when the line was written, just after the
last end hook; ``hook_begin_s`` / ``hook_end_s`` split each observer's hook
time, so a timeline can be rebuilt.  ``observers`` lists every observer
that received the stage, ``profiled_by`` those besides this one that are
not passive (a watcher does not make a stage profiled), ``enclosed_by`` the
non-passive ones that held an enclosing stage open (verl's ``train_batch`` runs inside ``actor_update``:
an msprobe session around it slows it too), and ``profiled`` says whether
either list has any.  ``hook_s`` is each observer's own
time in its begin and end hooks (outside ``elapsed_s``); ``overhead_s`` sums
them over the other observers, so ``elapsed_s + overhead_s`` is what the
stage cost with profiling.  ``dump_bytes``
counts this rank's files under ``{save_path}/step_{N}/{stage}``: the
directories named ``rank{R}`` and files whose name carries ``rank{R}``.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import structlog

from verl_events import ConfigError, InstallContext, Observer, StageReport, prepare_output_dir, stage_output_dir
from verl_events.layout import (
    TIMING_DIR,
    SavePathTaken,
    claim_save_path,
    refuse_other_runs,
    run_files,
    run_id,
    timing_log_files,
    timing_log_path,
)


class TimingObserver(Observer):
    """Record each selected stage's time and every observer's overhead.

    It runs outermost (priority 1000) so its line is written after every
    other observer has finished with the stage.  ``console: true`` also
    prints one concise line per stage to stderr.
    """

    priority = 1000
    wants_timings = True
    passive = True

    def __init__(self, console: bool = False) -> None:
        self.console = console
        self._root = Path()
        self._lock = threading.Lock()
        self._files: dict[int, IO[str]] = {}
        self._loggers: dict[int, Any] = {}
        self._console_log: Any = None
        self._run: str | None = None

    def setup(self, context: InstallContext) -> None:
        self._root = context.save_path
        prepare_output_dir(context.save_path / TIMING_DIR)
        try:
            refuse_other_runs(context.save_path, timing_log_files(context.save_path), "timing log(s)")
        except SavePathTaken as exc:
            raise ConfigError(str(exc)) from None
        if self.console:
            self._console_log = structlog.wrap_logger(
                structlog.PrintLogger(sys.stderr),
                processors=[structlog.processors.KeyValueRenderer(key_order=["event", "stage", "step", "rank"])],
            )

    def _logger_for(self, rank: int) -> Any:
        # One file per rank, opened on first use: the rank may only be known
        # once torch.distributed is initialised, after install.
        log = self._loggers.get(rank)
        if log is None:
            if self._run is None:
                # At the first record, not at install: a process that runs no
                # stage (verl's driver) must not claim the save_path.  Checked
                # again here, for a run started at the same time as this one.
                refuse_other_runs(self._root, timing_log_files(self._root), "timing log(s)")
                claim_save_path(self._root, run_files(self._root))
                self._run = run_id()
            handle = timing_log_path(self._root, rank).open("a", encoding="utf-8", buffering=1)
            self._files[rank] = handle
            log = self._loggers[rank] = structlog.wrap_logger(
                structlog.WriteLogger(handle),
                processors=[
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.JSONRenderer(),
                ],
            )
        return log

    def on_stage_report(self, report: StageReport) -> None:
        event = report.event
        others = [name for name in report.observers if name != self.name and name not in report.passive]
        around = [name for name in report.enclosing if name != self.name]
        overhead = sum(report.hook_seconds.get(name, 0.0) for name in report.observers if name != self.name)
        fields = {
            "stage": event.stage,
            "role": event.role,
            "step": event.step,
            "rank": event.rank,
            "world_size": event.world_size,
            "depth": event.depth,
            "parent": event.parent,
            "elapsed_s": event.elapsed_s,
            "error": None if event.error is None else type(event.error).__name__,
            "observers": list(report.observers),
            "profiled": bool(others or around),
            "profiled_by": others,
            "enclosed_by": around,
            "hook_s": dict(report.hook_seconds),
            "hook_begin_s": dict(report.begin_seconds),
            "hook_end_s": dict(report.end_seconds),
            "overhead_s": overhead,
            "end_unix": time.time(),
            "dump_bytes": rank_bytes(stage_output_dir(self._root, event), event.rank) if others else 0,
        }
        with self._lock:
            log = self._logger_for(event.rank)
            log.info("stage", run=self._run, **fields)
        if self._console_log is not None:
            self._console_log.info(
                "stage",
                stage=event.stage,
                step=event.step,
                rank=event.rank,
                ms=round(event.elapsed_s * 1e3, 2),
                hooks_ms=round(overhead * 1e3, 2),
                observers=",".join(others) or "-",
            )

    def close(self) -> None:
        with self._lock:
            for handle in self._files.values():
                handle.close()
            self._files.clear()
            self._loggers.clear()


def rank_bytes(stage_dir: Path, rank: int) -> int:
    """Bytes of ``rank``'s output under one stage directory (see module docstring)."""
    if not stage_dir.is_dir():
        return 0
    marker = re.compile(rf"(^|[^A-Za-z0-9])rank[_-]?{rank}([^0-9]|$)")
    total = 0
    for path in stage_dir.rglob("*"):
        if not path.is_file():
            continue
        relative = path.relative_to(stage_dir).parts
        if any(marker.search(part) for part in relative):
            total += path.stat().st_size
    return total
