"""Each thread's open stages: one stack, kept by the emitter, read by the dispatcher; and
whether the stage being announced must carry its result and inputs on its end event.

The emitter (:mod:`verl_events.bus.emit`) pushes a stage's begin event before
sending ``stage_begin`` and pops it before sending ``stage_end``, so while
receivers run, the top of the stack is the stage being announced (on begin)
and the stages around it are below.  Stages on two threads never see each
other's stack.  Only the emitting thread touches its stack.

A dispatcher that delivered a begin to an observer that wants the stage's
result asks for it (:func:`ask_for_result`) while the emitter waits in
``stage_begin``'s send, on the same thread; the emitter takes the answer
(:func:`result_asked`) right after the send.  So the question lives with the
thread's stack, not in a set every thread shares.
"""

from __future__ import annotations

from verl_events.events.process import PROCESS
from verl_events.events.stages import StageEvent


def open_stages() -> list[StageEvent]:
    """This thread's open stages, outermost first (the list itself, for the emitter to change)."""
    local = PROCESS.threads
    stack: list[StageEvent] | None = getattr(local, "stack", None)
    if stack is None:
        stack = local.stack = []
    return stack


def ask_for_result(seq: int) -> None:
    """Ask the emitter to put stage ``seq``'s result and inputs on its end event."""
    PROCESS.threads.asked = seq


def result_asked(seq: int) -> bool:
    """Whether a receiver asked for stage ``seq``'s result; forgets the question."""
    local = PROCESS.threads
    asked = getattr(local, "asked", None)
    if asked is None:  # the common case: one attribute read
        return False
    local.asked = None
    return bool(asked == seq)
