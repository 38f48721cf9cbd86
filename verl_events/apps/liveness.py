"""Is a rank's process still there?  One answer for ``hangs`` and ``diagnose``.

A heartbeat beats at least every ``liveness_s`` while its process lives
(the watchdog's liveness beat: the file rewritten, or only its mtime set
when nothing changed; ``read_heartbeat`` gives the later as its ``time``).
So a rank whose heartbeat is not ``closed`` is

* **gone** when its host is this one and its process is not
  (:func:`~verl_events.observers.watchdog.record.process_alive`: no such
  pid, a zombie, or a pid reused by a later process);
* **silent** when its heartbeat is :data:`SILENT_BEATS` liveness beats older
  than the run's newest heartbeat (the other ranks' clocks, so the reader's
  own clock does not matter), or older than that plus :data:`SKEW_S` by the
  reader's clock (every rank stopped at once: the job is gone): a process
  killed on another host, or one stuck where its monitor thread cannot run
  (a C call holding the GIL);
* **alive** otherwise.

A heartbeat written before the liveness beat existed (no ``liveness_s``)
is judged by its pid only, on this host.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from .formats import hang_record

Heartbeat = hang_record.Heartbeat

__all__ = ["SILENT_BEATS", "SKEW_S", "Liveness", "liveness", "newest"]

#: A heartbeat older than this many liveness beats (plus a second of slack) has stopped.
SILENT_BEATS = 3
#: How far the reader's clock may be from the ranks' before every rank reads as stopped.
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


def newest(heartbeats: list[Heartbeat]) -> float | None:
    """The newest heartbeat's time: what the other ranks' clocks said last."""
    return max((beat.time for beat in heartbeats), default=None)


def liveness(beat: Heartbeat, now: float, newest: float | None = None, host: str | None = None) -> Liveness:
    """How ``beat``'s rank stands at ``now`` (see the module docstring), ``newest`` being
    the run's newest heartbeat (:func:`newest`); ``host`` is this machine's name
    (default: :func:`socket.gethostname`)."""
    if beat.closed:
        how = (beat.exit or {}).get("how")
        detail = (beat.exit or {}).get("detail")
        if detail and len(detail) > 120:
            detail = detail[:119] + "…"
        return Liveness("closed", f"closed ({how}{': ' + detail if detail else ''})" if how else "closed")
    age = now - beat.time
    here = beat.host is not None and beat.host == (host or socket.gethostname())
    if here and beat.pid is not None:
        alive = hang_record.process_alive(beat.pid, beat.started)
        if alive is False:
            return Liveness("gone", f"its process {beat.pid} on {beat.host} is gone")
    if beat.liveness_s is not None:
        limit = SILENT_BEATS * beat.liveness_s + 1.0
        behind = (newest if newest is not None else beat.time) - beat.time
        if behind > limit or age > limit + SKEW_S:
            silent = max(behind, age - SKEW_S if age > limit + SKEW_S else 0.0)
            return Liveness(
                "silent",
                f"no heartbeat for {silent:.0f} s (it beats every {beat.liveness_s:g} s while its process lives)",
            )
    if beat.liveness_s is None and not here:
        return Liveness("unknown", "its heartbeat predates the liveness beat and its host is not this one")
    return Liveness("alive", f"heartbeat {age:.0f} s old")
