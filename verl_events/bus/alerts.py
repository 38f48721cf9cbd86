"""Anomalies and hangs, as the dispatcher delivers them to observers' hooks.

The ``anomaly`` and ``hang`` signals are not stages: they have no begin to
pair with an end, and they arrive on the sender's thread (the sentinel's end
hook for an anomaly, the watchdog's monitor thread for a hang).  What they
share with stages is decided here: which observers hear them, and which of
those an event's stage, step and rank reach.
"""

from __future__ import annotations

from typing import TypeAlias

from verl_events.events.anomaly import AnomalyEvent
from verl_events.events.hang import HangEvent
from verl_events.events.observer import Observer

Alert: TypeAlias = AnomalyEvent | HangEvent


def defines_hook(observer: Observer, hook: str) -> bool:
    """Whether ``observer``'s class defines ``hook``; the base class's does
    nothing, so an observer without its own is never called for it."""
    return getattr(type(observer), hook) is not getattr(Observer, hook)


def hears(observer: Observer, event: Alert) -> bool:
    """Whether an anomaly or hang falls in ``observer``'s selection: its stage,
    step and rank, as for a stage (an unknown step is outside a step list).
    Such an event names no role, so roles are not checked; an armed observer
    hears every step, since an anomaly is what arms it."""
    selection = observer.selection
    return (
        (selection.stages is None or event.stage in selection.stages)
        and (selection.steps is None or event.step in selection.steps)
        and (selection.ranks is None or event.rank in selection.ranks)
    )
