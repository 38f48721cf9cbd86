"""Stalls, read with what every other process was doing: one answer for ``hangs`` and ``diagnose``.

The watchdog writes a ``stall`` line when a process had no stage open past
its deadline, and a ``resumed`` line when a stage began again or the
process ended (:mod:`verl_events.observers.watchdog.stall_record`).  A
process with no stage open may be waiting, rightly, for another's work:
verl's trainer ranks are idle while the driver waits for generation
(``rollout_generate``), and the driver between its waits while the ranks
train.  So a stall is read against every other rank's stages:

* **waiting**: when the deadline passed, another rank (one the stalled
  process does not run) had a stage open, by its timing log (a stage that
  ended: its begin and end) or its heartbeat (a stage still open), and that
  stage was not itself waiting in a collective (its hang record names no
  ``torch.distributed`` call): the process waited on that one.  No failure;
  the stage it waited on has its own deadline.  (A stage that waits in a
  collective waits for its peers, the stalled process among them.  Read
  before that stage's own deadline passed, it cannot be told yet.)
* **resumed**: no other stage was open, and then a stage began, or the
  process ended normally: it was slow (a finding, as a stage that ended
  late is).
* **stuck**: no other stage was open and it never resumed (the process is
  still idle, was killed, or ended badly): the run made no progress
  anywhere (a ``stall`` failure, which makes a run ``hung``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from verl_events.observers.watchdog import record as hang_record
from verl_events.observers.watchdog import stall_record

from .ranks import DRIVER_RANK, rank_name

StallRecord = stall_record.StallRecord
finite_number = stall_record.finite_number
Heartbeat = hang_record.Heartbeat

__all__ = ["Stall", "StallRecord", "read_against", "since_phrase"]


@dataclass(frozen=True, slots=True)
class Stall:
    """A ``stall`` line, its ``resumed`` line if any, and what another rank was inside
    when its deadline passed (``waiting_on``, in words; None: no other stage was open)."""

    record: StallRecord
    resumed: StallRecord | None
    waiting_on: str | None

    @property
    def state(self) -> str:
        """``waiting``, ``resumed`` or ``stuck`` (see the module docstring)."""
        if self.waiting_on is not None:
            return "waiting"
        end = self.resumed
        if end is not None and (end.next is not None or end.how == "normal"):
            return "resumed"
        return "stuck"

    @property
    def ranks(self) -> list[int]:
        """The process's ranks: its stall line's, else (a stall before its first stage) its
        ``resumed`` line's, which knows the stage that began."""
        return self.record.ranks or (self.resumed.ranks if self.resumed is not None else [])

    @property
    def rank(self) -> int | None:
        """The process's rank (its first, where it runs several), or None when it is not known."""
        return self.ranks[0] if self.ranks else None

    def describe(self) -> str:
        """What happened, in one sentence without the process's name."""
        record = self.record
        said = (
            f"no stage began for {record.elapsed_s:.1f} s {since_phrase(record.after)}, "
            f"past its deadline of {record.deadline_s:.1f} s ({record.deadline})"
        )
        end = self.resumed
        if end is not None:
            then = f"{end.next.get('stage')} (step {end.next.get('step')}) began" if end.next else None
            said += f"; {then or f'the process ended ({end.how})'} after {end.elapsed_s:.1f} s"
        if self.waiting_on is not None:
            said += f"; meanwhile {self.waiting_on}"
        return said


def since_phrase(after: dict[str, Any] | None) -> str:
    """``after actor_update (step 2) ended``, or ``before its first stage``."""
    if after is None:
        return "before its first stage (since the watchdog was installed)"
    return f"after {after.get('stage')} (step {after.get('step')}) ended"


def read_against(
    records: Iterable[StallRecord],
    timing: Iterable[Any],
    heartbeats: Iterable[Heartbeat],
    hangs: Iterable[hang_record.HangRecord] = (),
) -> list[Stall]:
    """Each ``stall`` line with its ``resumed`` line, read against the other ranks' stages:
    ``timing`` the timing logs' records, ``heartbeats`` every rank's heartbeat, ``hangs`` the
    hang records (a stage waiting in a collective explains no stall)."""
    records = list(records)
    resumed = {r.key: r for r in records if r.kind == "resumed"}
    in_collective = {(h.rank, _key(h.stage), h.step) for h in hangs if h.kind == "hang" and h.waiting_in}
    spans = []
    for r in timing:  # a timing line's values are not checked for type when it is read
        end, elapsed = finite_number(r.end_unix), finite_number(r.elapsed_s)
        if end is None or elapsed is None or not isinstance(r.rank, int) or not isinstance(r.stage, str):
            continue
        if (r.rank, r.stage, r.step if isinstance(r.step, int) else None) not in in_collective:
            spans.append((r.rank, r.stage, r.step, end - elapsed, end))
    beats = [replace(beat, open=_open(beat, in_collective)) for beat in heartbeats]
    stalls = []
    for record in records:
        if record.kind == "stall":
            ended = resumed.get(record.key)
            own = set(record.ranks) | set(ended.ranks if ended is not None else ())
            stalls.append(Stall(record, ended, _waiting_on(record.time, own, spans, beats)))
    return stalls


def _open(beat: Heartbeat, in_collective: set[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """The heartbeat's open stages that are objects (a heartbeat is read as untrusted input),
    less those waiting in a collective."""
    items = [item for item in beat.open if isinstance(item, dict)] if isinstance(beat.open, list) else []
    return [i for i in items if (beat.rank, _key(i.get("stage")), _key(i.get("step"))) not in in_collective]


def _waiting_on(when: float, own: set[int], spans: list[tuple[Any, ...]], heartbeats: list[Heartbeat]) -> str | None:
    """What a rank not in ``own`` was inside at ``when`` (a stall's deadline passing), or None."""
    found: list[tuple[int, Any, Any, float]] = []
    for rank, stage, step, begin, end in spans:
        if rank not in own and begin <= when <= end:
            found.append((rank, stage, step, begin))
    for beat in heartbeats:
        if beat.rank in own:
            continue
        for item in beat.open:
            since = finite_number(item.get("since"))
            if since is not None and since <= when:
                found.append((beat.rank, item.get("stage"), item.get("step"), since))
    if not found:
        return None
    rank, stage, step, _ = min(found, key=lambda f: (f[0] != DRIVER_RANK, f[0], f[3]))  # the driver first
    return f"{rank_name(rank)} was inside {stage} (step {step})"


def _key(value: object) -> object:
    """``value`` where it can be part of a set's key (a string, a number, None), else None."""
    return value if value is None or isinstance(value, (str, int, float)) else None


def stall_json(stall: Stall) -> dict[str, Any]:
    """A stall for ``--json``: its line's fields, its state, what it waited on, its ``resumed`` line."""
    return stall.record.as_dict() | {
        "state": stall.state,
        "waiting_on": stall.waiting_on,
        "resumed": None if stall.resumed is None else stall.resumed.as_dict(),
    }


def stall_lines(stalls: list[Stall]) -> list[str]:
    """The stalls as text: the stuck first (nothing else was in progress), then the rest."""
    order = {"stuck": 0, "resumed": 1, "waiting": 2}
    lines = []
    for stall in sorted(stalls, key=lambda s: (order[s.state], s.record.time)):
        record = stall.record
        who = ", ".join(rank_name(rank) for rank in stall.ranks) or f"no rank: {record.process or 'unnamed'}"
        title = {"stuck": "STALL", "resumed": "stalled, then resumed", "waiting": "idle, waiting"}[stall.state]
        lines.append(f"{title}: process {record.pid} ({who}) on {record.host}: {stall.describe()}")
        if record.where is not None:
            code = f": {record.where.get('code')}" if record.where.get("code") else ""
            waiting = f", waiting in {record.waiting_in}" if record.waiting_in else ""
            where = record.where
            lines.append(
                f"  {record.thread} at {where.get('file')}:{where.get('line')} in {where.get('function')}{code}"
                f"{waiting}"
            )
        if record.report:
            lines.append(f"  every thread's stack: {record.report}")
    return lines
