"""``verl-events hangs`` as text, for a terminal."""

from __future__ import annotations

from datetime import datetime, timezone

from ..hang_suspect import suspect
from ..read.liveness import Newest, liveness, newest
from ..read.ranks import DRIVER_RANK, count_heartbeats, fold_alike, rank_name, ranks_phrase
from ..read.stalls import stall_lines
from .find import STATES, HangRecord, Hangs, Heartbeat, RankPosition

__all__ = ["render"]


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
        return "\n".join(lines + _no_hang_lines(result))
    on = {r.rank for r in result.hangs if (r.stage, r.step) == (stuck.stage, stuck.step)}
    lines.append(
        f"HANG: step {stuck.step}, {stuck.stage} passed its deadline ({stuck.deadline_s:g} s, {stuck.deadline}) "
        f"on {ranks_phrase(on)}"
    )
    lines.append(suspect(result.ranks, stuck.stage).line)
    lines += _ranks_by_state(result, stuck)
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
    if _ended(result):  # by the watchdog's abort, or a death: the story goes on past the hang
        lines.append(f"a rank ended: verl-events diagnose {result.run} says what followed")
    return "\n".join(lines + stall_lines(result.stalls))


def _ended(result: Hangs) -> bool:
    last = newest(result.heartbeats)
    return any(
        (beat.exit or {}).get("how") == "abort" or liveness(beat, result.now, last).stopped
        for beat in result.heartbeats
    )


def _no_hang_lines(result: Hangs) -> list[str]:
    """No stage passed its deadline: the stalls (or that none did), and each rank's state."""
    lines = stall_lines(result.stalls) or ["no deadline passed"]
    last = newest(result.heartbeats)
    states = ((beat.rank, _rank_state(beat, result.now, last)) for beat in result.heartbeats)
    lines += [f"  {line}" for line in fold_alike(states)]
    if any(liveness(beat, result.now, last).stopped for beat in result.heartbeats):
        lines.append(f"a rank stopped: verl-events diagnose {result.run} says how and what followed")
    return lines


def _ranks_by_state(result: Hangs, stuck: HangRecord) -> list[str]:
    """Each rank under its state against the stuck stage: inside it, never began it, finished it,
    waiting outside it (only when some rank is)."""
    owner = "the driver's" if stuck.rank == DRIVER_RANK else "the ranks'"
    titles = {
        "inside": f"inside {stuck.stage}",
        "never_began": "never began it",
        "finished": "finished it",
        "elsewhere": f"waiting outside it (it is {owner})",
    }
    lines = []
    for state in STATES:
        group = [p for p in result.ranks if p.state == state]
        if state == "elsewhere" and not group:
            continue
        lines.append(f"{titles[state]}: {len(group)}")
        lines += [f"  {line}" for line in fold_alike((p.rank, _position(p, state, result.now)) for p in group)]
    return lines


def _position(position: RankPosition, state: str, now: float) -> str:
    """Where a rank is against the stuck stage, since when, and how old its heartbeat is."""
    age = f"heartbeat {now - position.heartbeat.time:.0f} s old{', closed' if position.heartbeat.closed else ''}"
    if position.alive is not None and position.alive.stopped:
        age = f"STOPPED: {position.alive.reason}"
    if state == "inside":
        ran = (
            f", {position.heartbeat.time - position.since:.1f} s by its heartbeat" if position.since is not None else ""
        )
        return f"since {_clock(position.since)}{ran}, {_where(position)} ({age})"
    if state == "finished":
        late = f", late: {position.late_s:.1f} s" if position.late_s is not None else ""
        then = f"; at its deadline: {_where(position)}" if position.where is not None else ""
        return f"ended step {position.step} at {_clock(position.since)}{late}{then} ({age})"
    if state == "elsewhere":
        doing = (
            f"inside {position.stage}" if position.heartbeat.open else f"between stages, last ended {position.stage}"
        )
        return f"{doing} (step {position.step}) since {_clock(position.since)} ({age})"
    inside = "inside" if position.where is not None or position.heartbeat.open else "last ended"
    return (
        f"{inside} {position.stage} (step {position.step}) since {_clock(position.since)}, {_where(position)} ({age})"
    )
