"""``verl-events hangs RUN``: from a stuck run to the rank and the line.

Reads what the ``watchdog`` observer left under RUN (its save_path), through
the format's owner (:mod:`verl_events.observers.watchdog.record`): every
rank's heartbeat (its open stages, the last end of each stage) and
``hangs.jsonl`` (one record per stage that passed its deadline, with the
user frame of its thread, and one per such stage that ended late).

**The stuck stage** is the furthest one that passed its deadline: the
highest step, then the most stages begun on its rank (ranks that run the
same stages count alike), then the latest begin.  Every rank with a
heartbeat is then

* **inside** it: the stage is open in its heartbeat (since when, and where,
  from its own record of that stage when its deadline passed there too);
* **finished** it: its heartbeat has that stage ended at that step or later;
* **never began** it: neither; with its last stage (the innermost open one,
  else the last ended) and, when that stage passed its deadline, its frame;
* **elsewhere**: the stage is another kind of process's, so it waits outside it:
  the trainer ranks while verl's driver is stuck in its own stage (the wait for
  generation, ``rollout_generate``), and the driver while the ranks are stuck in
  theirs (:mod:`.ranks`).  These are never suspects.

A heartbeat beats at least every ``liveness_s`` while its process lives
(rewritten, or its mtime set when nothing changed): a rank whose heartbeat
stopped, or whose process is gone, is never called running
(:mod:`.liveness`); it is shown as stopped, with when and where, and
``verl-events diagnose`` says how it ended.  A rank that finished
the stuck stage late still shows where it was when its deadline passed.

The headline under ``HANG`` names the rank to look at first: one not in a
collective while the others wait in one (:mod:`.hang_suspect`).

**Stalls**: a process with no stage open past its deadline (the watchdog's
``stalls.jsonl``), each read against the other ranks' stages (:mod:`.stalls`):
``STALL`` when nothing else was in progress and it never resumed, then those
that resumed, then those that waited on another rank's stage.

Exit codes: 0 no deadline passed, 1 one did (also when the stage ended late
after all, and a stall), 2 bad input (no heartbeats nor stalls, RUN not a
directory).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from verl_events.observers import timing as timing_log
from verl_events.observers.watchdog import record as hang_record
from verl_events.observers.watchdog import stall_record

from .hang_suspect import suspect
from .jsonl import read_log
from .liveness import Liveness, Newest, liveness, newest
from .ranks import DRIVER_RANK, count_heartbeats, rank_name, ranks_phrase
from .stalls import Stall, read_against, stall_json, stall_lines

HangRecord = hang_record.HangRecord
Heartbeat = hang_record.Heartbeat

__all__ = ["Hangs", "HangsInputError", "RankPosition", "find_hangs", "render"]

STATES = ("inside", "never_began", "finished", "elsewhere")
R = TypeVar("R")


class HangsInputError(ValueError):
    """RUN cannot be read as a watched run (exit 2); the message says why."""


@dataclass(frozen=True, slots=True)
class RankPosition:
    """Where one rank stands against the stuck stage."""

    rank: int
    state: str  # one of STATES
    stage: str | None  # the stuck stage when inside or finished, else the rank's own last stage
    step: int | None
    since: float | None  # when that stage began (inside, never_began) or ended (finished)
    where: dict[str, Any] | None
    waiting_in: str | None
    heartbeat: Heartbeat
    late_s: float | None = None  # finished late: the stage's whole time
    alive: Liveness | None = None

    def as_json(self, now: float) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "name": rank_name(self.rank),
            "state": self.state,
            "stage": self.stage,
            "step": self.step,
            "since": self.since,
            "where": self.where,
            "waiting_in": self.waiting_in,
            "late_s": self.late_s,
            "heartbeat_time": self.heartbeat.time,
            "heartbeat_age_s": round(now - self.heartbeat.time, 3),
            "closed": self.heartbeat.closed,
            "liveness": None if self.alive is None else self.alive.state,
            "pid": self.heartbeat.pid,
            "host": self.heartbeat.host,
        }


@dataclass(slots=True)
class Hangs:
    """What the watchdog's files say of a run."""

    run: Path
    heartbeats: list[Heartbeat]
    records: list[HangRecord] = field(default_factory=list)
    stuck: HangRecord | None = None
    ranks: list[RankPosition] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    now: float = field(default_factory=time.time)

    @property
    def hangs(self) -> list[HangRecord]:
        return [r for r in self.records if r.kind == "hang"]

    @property
    def late(self) -> list[HangRecord]:
        return [r for r in self.records if r.kind == "late"]

    def as_json(self) -> dict[str, Any]:
        stuck = self.stuck
        return {
            "run": str(self.run),
            "hang": stuck is not None,
            "stuck": None if stuck is None else {"step": stuck.step, "stage": stuck.stage},
            "suspect": None if stuck is None else suspect(self.ranks, stuck.stage).as_json(),
            "ranks": [position.as_json(self.now) for position in self.ranks],
            "hangs": [_record(r) for r in self.hangs],
            "late": [_record(r) for r in self.late],
            "stalls": [stall_json(stall) for stall in self.stalls],
            "warnings": self.warnings,
        }


def _record(record: HangRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in HangRecord.__dataclass_fields__}


def find_hangs(run: Path) -> Hangs:
    """Join RUN's heartbeats and hang records.  HangsInputError when RUN is
    not a directory or holds no heartbeat that can be read; a heartbeat or a
    line that cannot be read is skipped with a sentence in ``warnings``."""
    if not run.is_dir():
        raise HangsInputError(
            f"{run} {'is not a directory' if run.exists() else 'does not exist'}; pass the save_path of a run"
        )
    files = hang_record.heartbeat_files(run)
    warnings: list[str] = []
    stalls = _read_records(stall_record.stalls_log_path(run), stall_record.StallRecord.from_json, warnings)
    if not files and not stalls:
        raise HangsInputError(
            f"{run} has no heartbeats ({hang_record.heartbeat_dir(run)}/rank*.json) and no stalls: the watchdog "
            "observer did not run there; add '- name: watchdog' to the run's observers"
        )
    heartbeats = []
    for path in files:
        try:
            heartbeats.append(hang_record.read_heartbeat(path))
        except (hang_record.NotAHeartbeat, OSError) as exc:
            warnings.append(f"{path} was skipped: {exc}")
    if files and not heartbeats and not stalls:
        raise HangsInputError(
            f"none of the {len(files)} heartbeat(s) under {hang_record.heartbeat_dir(run)} can be read"
        )
    records = _read_records(hang_record.hangs_log_path(run), HangRecord.from_json, warnings)
    result = Hangs(run, heartbeats, records, warnings=warnings)
    if stalls:
        result.stalls = read_against(stalls, _timing_records(run, warnings), heartbeats, records)
    hung = result.hangs
    if hung:
        result.stuck = max(hung, key=lambda r: (-1 if r.step is None else r.step, r.begun, r.began))
        result.ranks = [_position(beat, result.stuck, result.records) for beat in heartbeats]
        last = newest(heartbeats)
        result.ranks = [_alive(p, liveness(p.heartbeat, result.now, last)) for p in result.ranks]
    return result


def _alive(position: RankPosition, state: Liveness) -> RankPosition:
    fields = {name: getattr(position, name) for name in RankPosition.__dataclass_fields__}
    return RankPosition(**(fields | {"alive": state}))


def _read_records(path: Path, parse: Callable[[str], R], warnings: list[str]) -> list[R]:
    try:
        log = read_log(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise HangsInputError(f"{path} cannot be read: {exc}") from exc

    def skipped(number: int, exc: Exception) -> None:
        warnings.append(f"{path}:{number} was skipped: {exc}")

    return [record for _, record in log.records(parse, skipped)]


def _timing_records(run: Path, warnings: list[str]) -> list[Any]:
    """Every rank's timing records (the stages that ended, to read the stalls against), or
    none with a warning where a log cannot be read."""
    found: list[Any] = []
    for path in timing_log.timing_log_files(run):
        try:
            found += _read_records(path, timing_log.TimingRecord.from_json, warnings)
        except HangsInputError as exc:
            warnings.append(f"{exc}; the stalls are read without it")
    return found


def _position(beat: Heartbeat, stuck: HangRecord, records: list[HangRecord]) -> RankPosition:
    mine = [r for r in records if r.rank == beat.rank]
    elsewhere = (beat.rank == DRIVER_RANK) != (stuck.rank == DRIVER_RANK)

    def record_of(stage: str, step: int | None, kind: str = "hang") -> HangRecord | None:
        return next((r for r in reversed(mine) if (r.kind, r.stage, r.step) == (kind, stage, step)), None)

    for item in beat.open:
        if (item.get("stage"), item.get("step")) == (stuck.stage, stuck.step):
            own = record_of(stuck.stage, stuck.step)
            return RankPosition(
                beat.rank,
                "inside",
                stuck.stage,
                stuck.step,
                item.get("since"),
                own.where if own else None,
                own.waiting_in if own else None,
                beat,
            )
    ended = beat.ended.get(stuck.stage)
    if ended is not None and ended.get("step") is not None and stuck.step is not None and ended["step"] >= stuck.step:
        late = record_of(stuck.stage, stuck.step, "late")
        own = record_of(stuck.stage, stuck.step)  # where it was when its deadline passed, if it did
        return RankPosition(
            beat.rank,
            "finished",
            stuck.stage,
            ended["step"],
            ended.get("time"),
            own.where if own else None,
            own.waiting_in if own else None,
            beat,
            late_s=late.elapsed_s if late else None,
        )
    if beat.open:
        last = beat.open[-1]
        stage, step, since = last.get("stage"), last.get("step"), last.get("since")
    elif beat.last_ended is not None:
        stage, step, since = beat.last_ended.get("stage"), beat.last_ended.get("step"), beat.last_ended.get("time")
    else:
        stage = step = since = None
    own = record_of(stage, step) if beat.open and isinstance(stage, str) else None
    return RankPosition(
        beat.rank,
        "elsewhere" if elsewhere else "never_began",
        stage,
        step,
        since,
        own.where if own else None,
        own.waiting_in if own else None,
        beat,
    )


# -- text --------------------------------------------------------------------------


def _rank_state(beat: Heartbeat, now: float, newest_beat: Newest) -> str:
    """A rank with no stuck stage: running, closed (and how), or stopped (and where)."""
    state = liveness(beat, now, newest_beat)
    last = beat.last_ended or {}
    ended = f"last ended {last.get('stage', 'nothing')} at step {last.get('step')}"
    if state.state == "closed":
        return f"{state.reason}, {ended}"
    if not state.stopped:
        return f"running, {ended}" if state.state == "alive" else f"{state.reason}, {ended}"
    inside = beat.open[-1] if beat.open else None
    at = f"inside step {inside.get('step')}'s {inside.get('stage')}" if inside else ended
    return f"STOPPED beating at {_clock(beat.time)} {at}: {state.reason}"


def _clock(unix: float | None) -> str:
    if unix is None:
        return "?"
    return datetime.fromtimestamp(unix, timezone.utc).strftime("%H:%M:%S.%f")[:-3] + "Z"


def _where(position: RankPosition) -> str:
    where = position.where
    if where is None:
        return "no frame recorded (its watchdog has not reported this stage)"
    code = f": {where['code']}" if where.get("code") else ""
    text = f"at {where['file']}:{where['line']} in {where['function']}{code}"
    return text + (f", waiting in {position.waiting_in}" if position.waiting_in else "")


def render(result: Hangs) -> str:
    """The result as text, for a terminal."""
    runs = sorted({b.run for b in result.heartbeats if b.run})
    beating = count_heartbeats(b.rank for b in result.heartbeats)
    lines = [f"run: {result.run} ({beating}{', run ' + ', '.join(runs) if runs else ''})"]
    stuck = result.stuck
    if stuck is None:
        lines += stall_lines(result.stalls) or ["no deadline passed"]
        last = newest(result.heartbeats)
        for beat in result.heartbeats:
            lines.append(f"  {rank_name(beat.rank)}: {_rank_state(beat, result.now, last)}")
        if any(liveness(beat, result.now, last).stopped for beat in result.heartbeats):
            lines.append(f"a rank stopped: verl-events diagnose {result.run} says how and what followed")
        return "\n".join(lines)
    on = {r.rank for r in result.hangs if (r.stage, r.step) == (stuck.stage, stuck.step)}
    lines.append(
        f"HANG: step {stuck.step}, {stuck.stage} passed its deadline ({stuck.deadline_s:g} s, {stuck.deadline}) "
        f"on {ranks_phrase(on)}"
    )
    lines.append(suspect(result.ranks, stuck.stage).line)
    owner = "the driver's" if stuck.rank == DRIVER_RANK else "the ranks'"
    titles = {
        "inside": f"inside {stuck.stage}",
        "never_began": "never began it",
        "finished": "finished it",
        "elsewhere": f"waiting outside it (it is {owner})",
    }
    for state in STATES:
        group = [p for p in result.ranks if p.state == state]
        if state == "elsewhere" and not group:
            continue
        lines.append(f"{titles[state]}: {len(group)}")
        for p in group:
            age = f"heartbeat {result.now - p.heartbeat.time:.0f} s old{', closed' if p.heartbeat.closed else ''}"
            if p.alive is not None and p.alive.stopped:
                age = f"STOPPED: {p.alive.reason}"
            if state == "inside":
                ran = f", {p.heartbeat.time - p.since:.1f} s by its heartbeat" if p.since is not None else ""
                lines.append(f"  {rank_name(p.rank)}: since {_clock(p.since)}{ran}, {_where(p)} ({age})")
            elif state == "finished":
                late = f", late: {p.late_s:.1f} s" if p.late_s is not None else ""
                then = f"; at its deadline: {_where(p)}" if p.where is not None else ""
                lines.append(f"  {rank_name(p.rank)}: ended step {p.step} at {_clock(p.since)}{late}{then} ({age})")
            elif state == "elsewhere":
                doing = f"inside {p.stage}" if p.heartbeat.open else f"between stages, last ended {p.stage}"
                lines.append(f"  {rank_name(p.rank)}: {doing} (step {p.step}) since {_clock(p.since)} ({age})")
            else:
                inside = "inside" if p.where is not None or p.heartbeat.open else "last ended"
                lines.append(
                    f"  {rank_name(p.rank)}: {inside} {p.stage} (step {p.step}) since {_clock(p.since)}, "
                    f"{_where(p)} ({age})"
                )
    others = [r for r in result.hangs if (r.stage, r.step) != (stuck.stage, stuck.step)]
    for r in others:
        lines.append(f"also past its deadline: {rank_name(r.rank)}, step {r.step} {r.stage} ({r.elapsed_s:.1f} s)")
    for r in result.late:
        lines.append(
            f"ended late after all: {rank_name(r.rank)}, step {r.step} {r.stage}, after {r.elapsed_s:.1f} s "
            f"(deadline {r.deadline_s:g} s)"
        )
    reports = [r.report for r in result.hangs if r.report]
    if reports:
        lines.append(f"reports (under {result.run}): {', '.join(reports)}")
    return "\n".join(lines + stall_lines(result.stalls))


# -- the command ----------------------------------------------------------------------


def add_command(commands: Any) -> None:
    """Add ``hangs`` to the ``verl-events`` parser's subcommands."""
    parser = commands.add_parser(
        "hangs",
        help="which rank is stuck where, from the watchdog's heartbeats and hang records "
        "(exit 0 none, 1 a deadline passed, 2 bad input)",
    )
    parser.add_argument("run", help="the run's save_path (holding the watchdog's heartbeats)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(run_command=command)


def command(args: Any) -> int:
    """``verl-events hangs RUN [--json]``; the exit code (see the module docstring)."""
    import json
    import sys

    try:
        result = find_hangs(Path(args.run))
    except HangsInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in result.warnings:
        print(f"warning: {line}", file=sys.stderr)
    print(json.dumps(result.as_json(), indent=1) if args.json else render(result))
    return 1 if result.hangs or result.stalls else 0
