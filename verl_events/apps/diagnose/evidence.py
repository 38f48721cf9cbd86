"""Every failure a run folder holds, whichever tool wrote it, as one kind of record.

* the watchdog's crash records (:mod:`~verl_events.observers.watchdog.crash`):
  a stage that raised (``exception``), a terminating signal (``signal``);
* its fatal dumps: a segfault's or an abort's stacks (``signal``, timed by
  the file);
* its heartbeats: a rank that stopped beating without closing and left no
  record of why (``killed``: SIGKILL leaves nothing else), or that closed
  after an exception outside any stage;
* ``hangs.jsonl``: a stage past its deadline (``hang``);
* the timing logs: a stage that raised on a rank the watchdog did not watch;
* the sentinel's ``anomalies.jsonl`` (``anomaly``).

Each reader skips what it cannot read with a sentence in ``warnings``, and
records of another run (their ``run`` is not the folder's, from
``run.json``) likewise.
"""

from __future__ import annotations

import linecache
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_events.frames import is_library_file
from verl_events.layout import owner_of

from ..formats import anomaly_record, hang_record, timing_log
from ..jsonl import numbered_lines
from ..liveness import liveness

if TYPE_CHECKING:
    from observers.watchdog import crash
else:
    from verl_events.observers.watchdog import crash

Heartbeat = hang_record.Heartbeat

#: Signals a launcher sends to end a job's processes.
LAUNCHER_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")

__all__ = ["Evidence", "Failure", "gather"]


@dataclass(frozen=True, slots=True)
class Failure:
    """One rank's failure.  ``time`` is when it happened (Unix seconds); for
    ``killed``, the last heartbeat (it died within one liveness beat after)."""

    kind: str  # exception, signal, killed, hang, anomaly
    rank: int
    time: float
    detail: str
    step: int | None = None
    stage: str | None = None
    host: str | None = None
    pid: int | None = None
    where: dict[str, Any] | None = None
    source: str = ""  # the file it was read from, relative to the run
    message: str | None = None  # an exception's message, for telling a consequence
    waiting_in: str | None = None  # a hang: the torch.distributed call it waits in
    in_stage: bool = True  # False: between stages (step and stage are the last that ended)

    def as_json(self) -> dict[str, Any]:
        keys = ("rank", "host", "pid", "step", "stage", "kind", "detail", "where", "time", "source")
        return {key: getattr(self, key) for key in keys}


@dataclass(slots=True)
class Evidence:
    """What :func:`gather` found in a run folder."""

    run: Path
    run_id: str | None
    failures: list[Failure] = field(default_factory=list)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    hang_records: int = 0
    late_records: int = 0
    ends: list[Any] = field(default_factory=list)  # crash.ProcessEnd, one per process that said how it ended
    teardown: list[Failure] = field(default_factory=list)  # launcher signals after the driver ended normally
    timing_records: int = 0
    timing: list[Any] = field(default_factory=list)  # the timing logs' records, for the stragglers
    timing_ranks: int = 0
    timing_errors: int = 0
    warnings: list[str] = field(default_factory=list)
    now: float = field(default_factory=time.time)


def gather(run: Path) -> Evidence:
    """Read every failure under ``run`` (see the module docstring)."""
    evidence = Evidence(run, owner_of(run))
    _read_heartbeats(evidence)
    _process_ends(evidence)
    _crash_records(evidence)
    _fatal_dumps(evidence)
    _stopped_ranks(evidence)
    _teardown(evidence)
    _hangs(evidence)
    _timing(evidence)
    _anomalies(evidence)
    return evidence


def _relative(evidence: Evidence, path: Path) -> str:
    try:
        return path.relative_to(evidence.run).as_posix()
    except ValueError:
        return str(path)


def _of_this_run(evidence: Evidence, run: str | None, where: str) -> bool:
    if evidence.run_id is None or run is None or run == evidence.run_id:
        return True
    evidence.warnings.append(
        f"{where} was skipped: it belongs to run {run!r}, and this folder to run {evidence.run_id!r}"
    )
    return False


def _lines(evidence: Evidence, path: Path) -> list[tuple[int, str]]:
    try:
        return numbered_lines(path)
    except (OSError, UnicodeDecodeError) as exc:
        evidence.warnings.append(f"{path} cannot be read: {exc}")
        return []


def _crash_records(evidence: Evidence) -> None:
    for _, path in crash.crash_log_files(evidence.run):
        for number, line in _lines(evidence, path):
            where = f"{path}:{number}"
            try:
                record = crash.CrashRecord.from_json(line)
            except ValueError as exc:
                evidence.warnings.append(f"{where} was skipped: {exc}")
                continue
            if not _of_this_run(evidence, record.run, where):
                continue
            in_stage = record.kind == "exception" or record.stage is not None
            detail = f"{record.error_type}: {record.message}" if record.kind == "exception" else str(record.signal)
            evidence.failures.append(
                Failure(
                    record.kind,
                    record.rank,
                    record.time,
                    detail,
                    record.step,
                    record.stage,
                    record.host,
                    record.pid,
                    record.where,
                    _relative(evidence, path),
                    message=record.message,
                    in_stage=in_stage,
                )
            )


def _user_frame(frames: list[tuple[str, int, str]]) -> dict[str, Any] | None:
    """The innermost user frame of faulthandler's frames (innermost first), with its code if readable."""
    for file, line, function in frames:
        if not is_library_file(file):
            return {"file": file, "line": line, "function": function, "code": linecache.getline(file, line).strip()}
    return None


def _dump_where(dump: Any, beat: Heartbeat | None) -> dict[str, Any] | None:
    """The line a dump shows: in the thread that got a fatal signal; else (a terminating
    signal runs its handler on any thread) in the innermost open stage's thread, by the
    heartbeat; else the first thread with a user frame."""
    threads = list(dump.threads.values())
    stage_thread = None
    ident = (beat.open[-1].get("thread_id") if beat is not None and beat.open else None) or None
    if isinstance(ident, int):
        stage_thread = next((f for h, f in dump.threads.items() if f"0x{ident:016x}" in h.lower()), None)
    fatal = not dump.error.startswith("terminated by")
    order = [dump.current, stage_thread] if fatal else [stage_thread, dump.current]
    for frames in [*order, *threads]:
        where = _user_frame(frames) if frames else None
        if where is not None:
            return where
    return None


def _fatal_dumps(evidence: Evidence) -> None:
    by_rank = {beat.rank: beat for beat in evidence.heartbeats}
    for path in crash.fatal_files(evidence.run, written=True):
        try:
            dump = crash.read_fatal(path)
        except (OSError, ValueError) as exc:
            evidence.warnings.append(f"{path} was skipped: {exc}")
            continue
        if dump is None:
            continue
        beat = by_rank.get(dump.rank) if dump.rank is not None else None
        if beat is None and dump.pid is not None:
            beat = next((b for b in evidence.heartbeats if b.pid == dump.pid), None)
        step, stage = _position(beat) if beat is not None else (None, None)
        named = dump.signal and not dump.error.startswith("terminated")
        evidence.failures.append(
            Failure(
                "signal",
                beat.rank if beat is not None else (-1 if dump.rank is None else dump.rank),
                dump.time,
                f"{dump.signal} ({dump.error})" if named else (dump.signal or dump.error),
                step,
                stage,
                beat.host if beat is not None else None,
                dump.pid or (beat.pid if beat is not None else None),
                _dump_where(dump, beat),
                _relative(evidence, path),
                in_stage=beat is not None and bool(beat.open),
            )
        )


def _process_ends(evidence: Evidence) -> None:
    """How each process ended; a process without ranks (verl's driver) that raised is a failure too."""
    path = crash.ends_log_path(evidence.run)
    for number, line in _lines(evidence, path):
        try:
            end = crash.ProcessEnd.from_json(line)
        except ValueError as exc:
            evidence.warnings.append(f"{path}:{number} was skipped: {exc}")
            continue
        if not _of_this_run(evidence, end.run, f"{path}:{number}"):
            continue
        evidence.ends.append(end)
        if not end.ranks and end.how == "exception":
            evidence.failures.append(
                Failure(
                    "exception",
                    -1,
                    end.time,
                    str(end.detail),
                    host=end.host,
                    pid=end.pid,
                    source=_relative(evidence, path),
                    message=end.detail,
                    in_stage=False,
                )
            )


def _teardown(evidence: Evidence) -> None:
    """A process without ranks (verl's driver) that ended normally means the run finished:
    a launcher's signal, or a kill, that then found a rank between stages is the launcher
    ending the job's workers (Ray does so at every shutdown), not a failure."""
    if not any(not end.ranks and end.how == "normal" for end in evidence.ends):
        return
    for failure in list(evidence.failures):
        launcher = failure.kind == "killed" or (failure.kind == "signal" and failure.detail in LAUNCHER_SIGNALS)
        if launcher and not failure.in_stage:
            evidence.failures.remove(failure)
            evidence.teardown.append(failure)


def _read_heartbeats(evidence: Evidence) -> None:
    for path in hang_record.heartbeat_files(evidence.run):
        try:
            beat = hang_record.read_heartbeat(path)
        except (hang_record.NotAHeartbeat, OSError) as exc:
            evidence.warnings.append(f"{path} was skipped: {exc}")
            continue
        if _of_this_run(evidence, beat.run, str(path)):
            evidence.heartbeats.append(beat)


def _stopped_ranks(evidence: Evidence) -> None:
    """A rank that stopped beating without closing and left no record of why: killed (SIGKILL
    leaves nothing else); one that closed after an exception outside the stages."""
    explained = {f.rank for f in evidence.failures if f.kind in ("exception", "signal")}
    for beat in evidence.heartbeats:
        if beat.rank in explained:
            continue
        state = liveness(beat, evidence.now)
        source = _relative(evidence, hang_record.heartbeat_path(evidence.run, beat.rank))
        step, stage = _position(beat)
        exit = beat.exit or {}
        if state.stopped:
            detail = f"stopped beating at {_clock(beat.time)}{_within(beat)} without closing: {state.reason}"
            evidence.failures.append(
                Failure(
                    "killed",
                    beat.rank,
                    beat.time,
                    detail,
                    step,
                    stage,
                    beat.host,
                    beat.pid,
                    source=source,
                    in_stage=bool(beat.open),
                )
            )
        elif state.state == "closed" and exit.get("how") == "exception":
            detail = str(exit.get("detail"))
            evidence.failures.append(
                Failure(
                    "exception",
                    beat.rank,
                    beat.time,
                    detail,
                    step,
                    stage,
                    beat.host,
                    beat.pid,
                    source=source,
                    message=detail,
                )
            )


def _position(beat: Heartbeat) -> tuple[int | None, str | None]:
    """The innermost open stage, else the last one that ended."""
    last = beat.open[-1] if beat.open else (beat.last_ended or {})
    return last.get("step"), last.get("stage")


def _within(beat: Heartbeat) -> str:
    return f" (it died within {beat.liveness_s:g} s after)" if beat.liveness_s else ""


def _clock(unix: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(unix)) + f".{int(unix % 1 * 1000):03d}Z"


def _hangs(evidence: Evidence) -> None:
    path = hang_record.hangs_log_path(evidence.run)
    for number, line in _lines(evidence, path):
        try:
            record = hang_record.HangRecord.from_json(line)
        except ValueError as exc:
            evidence.warnings.append(f"{path}:{number} was skipped: {exc}")
            continue
        if not _of_this_run(evidence, record.run, f"{path}:{number}"):
            continue
        if record.kind == "late":
            evidence.late_records += 1
            continue
        evidence.hang_records += 1
        waiting = f", waiting in {record.waiting_in}" if record.waiting_in else ""
        evidence.failures.append(
            Failure(
                "hang",
                record.rank,
                record.time,
                f"passed its deadline of {record.deadline_s:g} s ({record.deadline}){waiting}",
                record.step,
                record.stage,
                record.host,
                record.pid,
                record.where,
                _relative(evidence, path),
                waiting_in=record.waiting_in,
            )
        )


def _timing(evidence: Evidence) -> None:
    """Stages that raised, from the timing logs, where no crash record says so already."""
    recorded = {(f.rank, f.step, f.stage) for f in evidence.failures if f.kind == "exception"}
    found: dict[tuple[int, int | None, str | None, str | None], Any] = {}
    files = timing_log.timing_log_files(evidence.run)
    evidence.timing_ranks = len(files)
    for path in files:
        for number, line in _lines(evidence, path):
            try:
                record = timing_log.TimingRecord.from_json(line)
            except ValueError as exc:
                evidence.warnings.append(f"{path}:{number} was skipped: {exc}")
                continue
            evidence.timing_records += 1
            evidence.timing.append(record)
            if record.error is None or not _of_this_run(evidence, record.run, f"{path}:{number}"):
                continue
            evidence.timing_errors += 1
            # The exception leaves every enclosing stage too: keep the innermost.
            key = (record.rank, record.step, record.error, record.message)
            if key not in found or record.depth > found[key][0].depth:
                found[key] = (record, path)
    for record, path in found.values():
        if (record.rank, record.step, record.stage) in recorded:
            continue
        message = record.message
        evidence.failures.append(
            Failure(
                "exception",
                record.rank,
                record.end_unix or 0.0,
                f"{record.error}: {message}" if message is not None else str(record.error),
                record.step,
                record.stage,
                source=_relative(evidence, path),
                message=message,
            )
        )


def _anomalies(evidence: Evidence) -> None:
    path = anomaly_record.anomaly_log_path(evidence.run)
    for number, line in _lines(evidence, path):
        try:
            record = anomaly_record.AnomalyRecord.from_json(line)
        except ValueError as exc:
            evidence.warnings.append(f"{path}:{number} was skipped: {exc}")
            continue
        if not _of_this_run(evidence, record.run, f"{path}:{number}"):
            continue
        evidence.failures.append(
            Failure(
                "anomaly",
                record.rank,
                record.time or 0.0,
                record.detail or f"{record.metric} = {record.value} broke rule {record.rule}",
                record.step,
                record.stage,
                source=_relative(evidence, path),
            )
        )
