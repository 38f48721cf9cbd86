"""How each rank's process ended, from the watchdog's files: crash records, faulthandler's
dumps, heartbeats (a rank that stopped beating: killed) and every process's end (the driver's
too: its normal end makes a launcher's SIGTERMs that follow teardown, not failures)."""

from __future__ import annotations

import dataclasses
import linecache
import math
import re
import time
from typing import Any

from verl_events.frames import is_library_file
from verl_events.observers.watchdog import crash
from verl_events.observers.watchdog import record as hang_record

from .liveness import liveness, newest
from .ranks import DRIVER_RANK, trainer_ranks
from .record import LAUNCHER_SIGNALS, NO_RANK, Evidence, Failure, of_this_run, records_of, relative

Heartbeat = hang_record.Heartbeat

#: A launcher's signal at most this long before the driver's normal end can be the shutdown's (a
#: killed rank's time is its last beat, up to a beat before its death; atexit order varies).
TEARDOWN_S = 10.0

#: Ray's words for an error a task raised in process N: ``RayTaskError(ActorDiedError): ray::TaskRunnerV1.run()
#: (pid=N, ...``; the type in brackets is what the task raised.
_RAISED_IN = re.compile(r"RayTaskError\((\w+)\): ray::[\w.]+\(\) \(pid=(\d+)\b")
#: What a task raises when another actor's process died.
_ACTOR_DEATHS = ("ActorDiedError", "RayActorError", "WorkerCrashedError")
_DEATH_KINDS = ("killed", "signal", "oom")
#: A last beat this close to a stage's beginning is that beginning (clock reads a few µs apart).
_SAME_MOMENT_S = 0.001

__all__ = [
    "crash_records",
    "fatal_dumps",
    "outlived",
    "process_ends",
    "read_heartbeats",
    "stopped_ranks",
    "teardown",
]


def crash_records(evidence: Evidence) -> None:
    """Stages that raised, and signals, except a signal the process lived through: its
    handler returned and the process's last word (``ends.jsonl``) is a normal end."""
    last_end = {end.pid: end for end in sorted(evidence.ends, key=lambda end: end.time)}
    for _, path in crash.crash_log_files(evidence.run):
        for _, record in records_of(evidence, path, crash.CrashRecord):
            end = last_end.get(record.pid)
            if record.kind == "signal" and end is not None and end.how == "normal" and end.time > record.time:
                continue
            in_stage = record.kind == "exception" or record.stage is not None
            detail = f"{record.error_type}: {record.message}" if record.kind == "exception" else str(record.signal)
            source = relative(evidence, path)
            evidence.failures.append(
                Failure.told_by(
                    record, record.kind, detail, source, message=record.message, in_stage=in_stage, parent=record.parent
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


def _dump_time(written: float, beat: Heartbeat | None) -> float:
    """When the signal came: the dump's modification time, unless the file was copied since
    (a copy without times, a download) and that time falls outside the window the rank's
    heartbeat allows (its last beat, and one liveness beat after): then the last beat."""
    if beat is None or not beat.liveness_s:
        return written
    return written if beat.time - 1.0 <= written <= beat.time + beat.liveness_s + 1.0 else beat.time


def fatal_dumps(evidence: Evidence) -> None:
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
                beat.rank if beat is not None else (NO_RANK if dump.rank is None else dump.rank),
                _dump_time(dump.time, beat),
                f"{dump.signal} ({dump.error})" if named else (dump.signal or dump.error),
                step,
                stage,
                beat.host if beat is not None else None,
                dump.pid or (beat.pid if beat is not None else None),
                _dump_where(dump, beat),
                relative(evidence, path),
                in_stage=beat is not None and bool(beat.open),
            )
        )


def process_ends(evidence: Evidence) -> None:
    """How each process ended (its last line: a process that lived through a signal says so
    again at its real end); a process without trainer ranks (``main_ppo``, verl's driver) that
    raised is a failure too: the driver's error outside its stages is known only from here."""
    path = crash.ends_log_path(evidence.run)
    for _, end in records_of(evidence, path, crash.ProcessEnd):
        evidence.ends.append(end)
    last = {end.pid: end for end in sorted(evidence.ends, key=lambda end: end.time)}
    for end in last.values():
        if not trainer_ranks(end.ranks) and end.how == "exception":
            evidence.failures.append(
                Failure(
                    "exception",
                    DRIVER_RANK if DRIVER_RANK in end.ranks else NO_RANK,
                    end.time,
                    str(end.detail),
                    host=end.host,
                    pid=end.pid,
                    source=relative(evidence, path),
                    message=end.detail,
                    in_stage=False,
                )
            )


def teardown(evidence: Evidence) -> None:
    """A process without trainer ranks (``main_ppo``, verl's driver) that ended normally means the run finished:
    a launcher's signal, or a kill, that then found a rank between stages is the launcher
    ending the job's workers (Ray does so at every shutdown), not a failure.  The normal end
    comes first, within :data:`TEARDOWN_S` (a kill long before it is no shutdown)."""
    finished = [end.time for end in evidence.ends if not trainer_ranks(end.ranks) and end.how == "normal"]
    if not finished:
        return
    for failure in list(evidence.failures):
        launcher = failure.kind == "killed" or (failure.kind == "signal" and failure.detail in LAUNCHER_SIGNALS)
        after = any(at - TEARDOWN_S <= failure.time for at in finished)
        if launcher and not failure.in_stage and after:
            evidence.failures.remove(failure)
            evidence.teardown.append(failure)


def outlived(evidence: Evidence) -> None:
    """A killed process whose task raised another process's failure was alive after it.  Its
    last beat can be older than that failure (beats are up to a liveness beat apart), so by
    time alone it would seem to have died first: verl's driver, which Ray ends at the job's end
    after its task raised ``ActorDiedError`` (a peer died) or passed on a rank's exception
    (``RayTaskError(RuntimeError)`` for a rank's ``RuntimeError``).  Its time becomes the
    tighter of the two lower bounds on its death, that failure's time, and the failure says
    which record decided."""
    for index, failure in enumerate(evidence.failures):
        if failure.kind != "killed":
            continue
        passed_on = _passed_on(evidence.failures, failure.pid)
        if passed_on is None:
            continue
        origin, kind, words, record = passed_on
        evidence.failures[index] = dataclasses.replace(
            failure,
            time=max(failure.time, origin),
            detail=f"{failure.detail}; alive after another process failed: its task raised {kind} ({record.source})",
            outlived=f"{words} ({record.source})",
        )


def _passed_on(failures: list[Failure], pid: int | None) -> tuple[float, str, str, Failure] | None:
    """The earliest failure of another process that process ``pid``'s task raised in Ray's words
    (when it failed, the type raised, how to say it, and the record naming it), or None.  A dead actor's error
    follows a death; any other type follows an exception of that type in another process, and
    only where ``pid`` has no exception of its own to have raised first."""
    own = any(f.kind == "exception" and f.pid == pid for f in failures)
    for record in failures:
        if record.kind != "exception":
            continue
        for kind, raiser in _RAISED_IN.findall(record.detail):
            if int(raiser) != pid:
                continue
            if kind in _ACTOR_DEATHS:
                deaths = [f.time for f in failures if f.kind in _DEATH_KINDS and f.pid != pid]
                return (min(deaths), kind, "a dead actor's error", record) if deaths else None
            if own:
                return None
            origins = [f.time for f in failures if _is_exception_of(f, kind) and f.pid != pid and f.time <= record.time]
            return (min(origins), kind, f"another process's {kind}", record) if origins else None
    return None


def _is_exception_of(failure: Failure, kind: str) -> bool:
    return failure.kind == "exception" and failure.detail.startswith(f"{kind}:")


def read_heartbeats(evidence: Evidence) -> None:
    for path in evidence.files(hang_record.heartbeat_files):
        try:
            beat = hang_record.read_heartbeat(path)
        except (hang_record.NotAHeartbeat, OSError) as exc:
            evidence.warnings.append(f"{path} was skipped: {exc}")
            continue
        if of_this_run(evidence, beat.run, str(path)):
            evidence.heartbeats.append(beat)


def stopped_ranks(evidence: Evidence) -> None:
    """A rank that stopped beating without closing and left no record of why: killed (SIGKILL
    leaves nothing else); one that closed after an exception outside the stages."""
    explained = {f.rank for f in evidence.failures if f.kind in ("exception", "signal")}
    last = newest(evidence.heartbeats)
    for beat in evidence.heartbeats:
        if beat.rank in explained:
            continue
        state = liveness(beat, evidence.now, last)
        source = relative(evidence, hang_record.heartbeat_path(evidence.run, beat.rank))
        exit = beat.exit or {}
        if state.stopped:
            detail = f"{_stopped(beat)} without closing: {state.reason}"
            if beat.from_boundary:
                # Which evidence placed it: a boundary crossed after its last heartbeat was written.
                detail += "; where: its stage-boundary record, newer than its last heartbeat"
            window = beat.liveness_s or 0.0
            evidence.failures.append(
                _of_heartbeat(beat, "killed", detail, source, in_stage=bool(beat.open), window=window)
            )
        elif state.state == "closed" and exit.get("how") == "exception":
            detail = str(exit.get("detail"))
            evidence.failures.append(_of_heartbeat(beat, "exception", detail, source, message=detail))


def _of_heartbeat(beat: Heartbeat, kind: str, detail: str, source: str, **more: Any) -> Failure:
    """A failure that only the rank's heartbeat tells: at its last beat, where it last was."""
    step, stage = _position(beat)
    return Failure(kind, beat.rank, beat.time, detail, step, stage, beat.host, beat.pid, source=source, **more)


def _position(beat: Heartbeat) -> tuple[int | None, str | None]:
    """The innermost open stage, else the last one that ended."""
    last = beat.open[-1] if beat.open else (beat.last_ended or {})
    return last.get("step"), last.get("stage")


def _stopped(beat: Heartbeat) -> str:
    """When the rank stopped beating and, in a stage, how far into it: no earlier than its last
    beat, no later than a liveness beat after it.  A last sign of life that is the stage's own
    beginning (its boundary record) means it died as the stage began."""
    since = beat.open[-1].get("since") if beat.open else None
    if isinstance(since, bool) or not isinstance(since, (int, float)) or not math.isfinite(since):
        since = None  # another writer's heartbeat, or none open: how far in is not known
    if since is None or not beat.liveness_s or since > beat.time:
        return f"stopped beating at {_clock(beat.time)}{_within(beat)}"
    into = beat.time - since
    if into < _SAME_MOMENT_S:
        return (
            f"killed as the stage began (within {beat.liveness_s:g} s of it: "
            f"no beat after its beginning at {_clock(beat.time)})"
        )
    return f"stopped beating {into:.1f} s into the stage, at {_clock(beat.time)}{_within(beat)}"


def _within(beat: Heartbeat) -> str:
    return f" (it died within {beat.liveness_s:g} s after)" if beat.liveness_s else ""


def _clock(unix: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(unix)) + f".{int(unix % 1 * 1000):03d}Z"
