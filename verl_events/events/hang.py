"""The ``hang`` signal: a stage ran past its deadline.

A watcher (the ``watchdog`` observer, or anyone) sends it with the stage
name as sender and ``event=HangEvent(...)``::

    hang.send("actor_update", event=HangEvent(...))

The watchdog sends it from its monitor thread, once per stage that passes
its deadline, after the stage's report is written: receivers run on that
thread, while the stage itself is still stuck on its own.  The installation's
dispatcher delivers it to the observers' ``on_hang`` hooks
(:mod:`verl_events.bus.alerts`); any other blinker receiver may connect too.
"""

from __future__ import annotations

from dataclasses import dataclass

from .signals import signals

hang = signals.signal("hang", doc="Sent with the stage name as sender and event=HangEvent.")


@dataclass(frozen=True, slots=True)
class HangEvent:
    """One stage, on one rank, that has run past its deadline and is still running.

    ``elapsed_s`` is how long it had run when the deadline passed was noticed;
    ``deadline_s`` the deadline it passed; ``where`` the innermost frame of
    user code in the stage's thread (``"file:line in function"``), or None
    when the stack holds none; ``report`` the report file the watchdog
    wrote (its path), or None when it could not be written.
    """

    step: int | None
    stage: str
    rank: int
    elapsed_s: float
    deadline_s: float
    where: str | None = None
    report: str | None = None
