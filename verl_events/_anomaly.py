"""The ``anomaly`` signal: a watcher saw a metric go wrong.

A watcher (the ``sentinel`` observer, or anyone) sends it with the stage
name as sender and ``event=AnomalyEvent(...)``::

    anomaly.send("actor_update", event=AnomalyEvent(...))

The core listens to it to arm capture observers configured with
``trigger: anomaly`` for the steps that follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._bus import signals

anomaly = signals.signal("anomaly", doc="Sent with the stage name as sender and event=AnomalyEvent.")

#: The rules a watcher may name in ``AnomalyEvent.rule``.
RULES = ("non_finite", "above", "below", "spike")


@dataclass(frozen=True, slots=True)
class AnomalyEvent:
    """One metric that broke one rule, on one rank, at one stage of one step.

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

    def as_record(self) -> dict[str, Any]:
        """One line of ``anomalies.jsonl``: JSON has no NaN or infinity, so a
        non-finite value is written as the string ``"nan"``, ``"inf"`` or ``"-inf"``."""
        return {
            "step": self.step,
            "stage": self.stage,
            "rank": self.rank,
            "metric": self.metric,
            "value": _json_float(self.value),
            "rule": self.rule,
            "baseline": None if self.baseline is None else _json_float(self.baseline),
            "detail": self.detail,
        }


def _json_float(value: float) -> float | str:
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return float(value)


def read_float(value: float | str) -> float:
    """The inverse of the record's encoding."""
    return float(value)
