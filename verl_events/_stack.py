"""Each thread's open stages: one stack, kept by the emitter, read by the dispatcher.

The emitter (:mod:`verl_events._emit`) pushes a stage's begin event before
sending ``stage_begin`` and pops it before sending ``stage_end``, so while
receivers run, the top of the stack is the stage being announced (on begin)
and the stages around it are below.  Stages on two threads never see each
other's stack.  Only the emitting thread touches its stack.
"""

from __future__ import annotations

import threading

from ._events import StageEvent

_local = threading.local()


def open_stages() -> list[StageEvent]:
    """This thread's open stages, outermost first (the list itself, for the emitter to change)."""
    stack: list[StageEvent] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack
