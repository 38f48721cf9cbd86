"""Is a rank's process still there?  One answer for ``hangs`` and ``diagnose``.

A heartbeat beats at least every ``liveness_s`` while its process lives
(the watchdog's liveness beat: the file rewritten, or only its mtime set
when nothing changed; ``read_heartbeat`` gives the later as its ``time``).
So a rank whose heartbeat is not ``closed`` is

* **gone** when its host is this one and its process is not
  (:func:`~verl_events.observers.watchdog.record.process_alive`: no such
  pid, a zombie, or a pid reused by a later process);
* **silent** when its heartbeat is :data:`SILENT_BEATS` liveness beats older
  than the newest heartbeat written on its own host (one clock: no skew to
  allow for); or older than that plus :data:`SKEW_S` against the newest
  heartbeat of any other host, or against the reader's clock (every rank of
  its host stopped at once: a node gone, or the job): a process killed on
  another host, or one stuck where its monitor thread cannot run (a C call
  holding the GIL);
* **alive** otherwise.

So clocks that disagree by up to :data:`SKEW_S` (between hosts, or between
a host and the reader) never make a live rank read as stopped; the price is
that a whole host that stopped reads as silent only :data:`SKEW_S` later.
A heartbeat is only ever compared with a clock it can be trusted against:
its own host's, or another's with the skew allowed for.

A heartbeat written before the liveness beat existed (no ``liveness_s``)
is judged by its pid only, on this host.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from verl_events.observers.watchdog import record as hang_record

Heartbeat = hang_record.Heartbeat

__all__ = ["SILENT_BEATS", "SKEW_S", "Liveness", "Newest", "liveness", "newest"]

#: A heartbeat older than this many liveness beats (plus a second of slack) has stopped.
SILENT_BEATS = 3
#: How far two hosts' clocks (or a host's and the reader's) may disagree before a live rank reads as stopped.
SKEW_S = 60.0


@dataclass(frozen=True, slots=True)
class Liveness:
    """``state``: ``closed``, ``alive``, ``gone``, ``silent`` or ``unknown``; ``reason`` in words."""

    state: str
    reason: str

    @property
    def stopped(self) -> bool:
        """Whether the rank's process stopped without closing (gone or silent)."""
        return self.state in ("gone", "silent")


@dataclass(frozen=True, slots=True)
class Newest:
    """The newest heartbeat of the run (``run``) and of each host (``hosts``): what
    each host's clock said last.  A heartbeat without a host counts as its own host."""

    run: float | None = None
    hosts: dict[str | None, float] = field(default_factory=dict)


def newest(heartbeats: list[Heartbeat]) -> Newest:
    """The newest heartbeat's time, of the run and of each host."""
    hosts: dict[str | None, float] = {}
    for beat in heartbeats:
        if beat.host is not None:
            hosts[beat.host] = max(beat.time, hosts.get(beat.host, beat.time))
    return Newest(max((beat.time for beat in heartbeats), default=None), hosts)


def liveness(beat: Heartbeat, now: float, newest: Newest | None = None, host: str | None = None) -> Liveness:
    """How ``beat``'s rank stands at ``now`` (see the module docstring), ``newest`` being
    the run's newest heartbeats (:func:`newest`); ``host`` is this machine's name
    (default: :func:`socket.gethostname`)."""
    if beat.closed:
        how = (beat.exit or {}).get("how")
        detail = (beat.exit or {}).get("detail")
        if detail and len(detail) > 120:
            detail = detail[:119] + "…"
        return Liveness("closed", f"closed ({how}{': ' + detail if detail else ''})" if how else "closed")
    age = now - beat.time
    here = beat.host is not None and beat.host == (host or socket.gethostname())
    alive = None
    if here and beat.pid is not None:
        alive = hang_record.process_alive(beat.pid, beat.started)
        if alive is False:
            return Liveness("gone", f"its process {beat.pid} on {beat.host} is gone")
    if beat.liveness_s is not None:
        silent = _silent_for(beat, age, newest or Newest(), SILENT_BEATS * beat.liveness_s + 1.0)
        if silent is not None:
            return Liveness(
                "silent",
                f"no heartbeat for {silent:.0f} s (it beats every {beat.liveness_s:g} s while its process lives)",
            )
    if beat.liveness_s is None and not here:
        return Liveness("unknown", "its heartbeat predates the liveness beat and its host is not this one")
    if beat.liveness_s is None and alive is None:
        return Liveness(
            "unknown",
            "its heartbeat predates the liveness beat, and its process cannot be told from another that "
            "has its pid now (no start time)",
        )
    return Liveness("alive", f"heartbeat {age:.0f} s old")


def _silent_for(beat: Heartbeat, age: float, newest: Newest, limit: float) -> float | None:
    """How long ``beat`` has been silent, judged by clocks it can be trusted against, or
    None when it may still beat: its own host's newest beat, any later beat of the run
    and the reader's ``age`` of it, the last two less :data:`SKEW_S`."""
    behind_host = newest.hosts.get(beat.host, beat.time) - beat.time if beat.host is not None else 0.0
    behind_run = (newest.run if newest.run is not None else beat.time) - beat.time - SKEW_S
    by_reader = age - SKEW_S
    silent = max(behind_host, behind_run, by_reader)
    return silent if silent > limit else None
