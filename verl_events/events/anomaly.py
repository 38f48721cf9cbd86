"""The ``anomaly`` signal: a watcher saw a metric go wrong.

A watcher (the ``sentinel`` observer, or anyone) sends it with the stage
name as sender and ``event=AnomalyEvent(...)``::

    anomaly.send("actor_update", event=AnomalyEvent(...))

The installation's dispatcher receives it: it notes the anomaly for armed
capture (``trigger: anomaly``) and replay, then delivers it to the
observers' ``on_anomaly`` hooks (:mod:`verl_events.bus.alerts`).  Any other
blinker receiver may connect to it as well, with blinker's own semantics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .signals import signals

anomaly = signals.signal("anomaly", doc="Sent with the stage name as sender and event=AnomalyEvent.")


@dataclass(frozen=True, slots=True)
class AnomalyEvent:
    """One metric that broke one rule, on one rank, at one stage of one step.

    The sentinel records each one as an
    :class:`~verl_events.observers.sentinel.record.AnomalyRecord`.
    ``value`` is the metric's value (NaN and infinities included);
    ``baseline`` what the rule compared it with (the threshold, or the
    running centre for a spike), or None for ``non_finite``; ``detail`` a
    short sentence for logs.
    """

    step: int | None
    stage: str
    rank: int
    metric: str
    value: float
    rule: str
    baseline: float | None = None
    detail: str = ""


def send_anomaly(found: AnomalyEvent, *, sender: str, strict: bool) -> None:
    """Send ``found`` on :data:`anomaly` (its stage as sender).  A receiver that raises is
    logged under ``sender``'s name (an observer's: the alarm is already in its own record),
    or, with ``strict``, raises."""
    try:
        anomaly.send(found.stage, event=found)
    except Exception:
        if strict:
            raise
        logging.getLogger(f"verl_events.{sender}").exception(
            "%s: a receiver of the anomaly signal failed for %s at step %s", sender, found.metric, found.step
        )
