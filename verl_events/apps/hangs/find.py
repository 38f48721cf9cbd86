"""Reading what the watchdog left under a run: where each rank is against the stuck stage
(see :mod:`verl_events.apps.hangs`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_events.observers import timing as timing_log
from verl_events.observers.watchdog import record as hang_record
from verl_events.observers.watchdog import stall_record

from ..hang_suspect import suspect
from ..read.deaths import read_heartbeats
from ..read.liveness import Liveness, liveness, newest
from ..read.ranks import DRIVER_RANK, rank_name
from ..read.record import Evidence
from ..read.stalls import Stall, read_against, stall_json

HangRecord = hang_record.HangRecord
Heartbeat = hang_record.Heartbeat
TimingRecord = timing_log.TimingRecord

__all__ = ["STATES", "Hangs", "HangsInputError", "RankPosition", "find_hangs"]

STATES = ("inside", "never_began", "finished", "elsewhere")


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
            "hangs": [r.as_dict() for r in self.hangs],
            "late": [r.as_dict() for r in self.late],
            "stalls": [stall_json(stall) for stall in self.stalls],
            "warnings": self.warnings,
        }


def find_hangs(run: Path) -> Hangs:
    """Join RUN's heartbeats and hang records.  HangsInputError when RUN is not a directory,
    holds no heartbeat that can be read, or its hang or stall log cannot be read; a heartbeat
    or a line that cannot be read, and a record of another run, are skipped with a sentence
    in ``warnings``."""
    evidence = Evidence.of_folder(run, HangsInputError)
    stalls = evidence.records(stall_record.stalls_log_path(run), stall_record.StallRecord, HangsInputError)
    files = evidence.files(hang_record.heartbeat_files)
    if not files and not stalls:
        raise HangsInputError(
            f"{run} has no heartbeats ({hang_record.heartbeat_dir(run)}/rank*.json) and no stalls: the watchdog "
            "observer did not run there; add '- name: watchdog' to the run's observers"
        )
    read_heartbeats(evidence)
    if files and not evidence.heartbeats and not stalls:
        raise HangsInputError(
            f"none of the {len(files)} heartbeat(s) under {hang_record.heartbeat_dir(run)} can be read "
            f"(the first: {evidence.warnings[0]})"
        )
    records = evidence.records(hang_record.hangs_log_path(run), HangRecord, HangsInputError)
    result = Hangs(run, evidence.heartbeats, records, warnings=evidence.warnings, now=evidence.now)
    if stalls:
        logs = evidence.files(timing_log.timing_log_files)
        timing = [record for path in logs for record in evidence.records(path, TimingRecord)]
        result.stalls = read_against(stalls, timing, evidence.heartbeats, records)
    hung = result.hangs
    if hung:
        result.stuck = max(hung, key=lambda r: (-1 if r.step is None else r.step, r.begun, r.began))
        result.ranks = [_position(beat, result.stuck, result.records) for beat in evidence.heartbeats]
        last = newest(evidence.heartbeats)
        result.ranks = [_alive(p, liveness(p.heartbeat, result.now, last)) for p in result.ranks]
    return result


def _alive(position: RankPosition, state: Liveness) -> RankPosition:
    fields = {name: getattr(position, name) for name in RankPosition.__dataclass_fields__}
    return RankPosition(**(fields | {"alive": state}))


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
