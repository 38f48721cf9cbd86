"""The sentinel's records: an anomaly (a line of ``{save_path}/anomalies.jsonl``) and a
replay's verdict (a line of ``{save_path}/replays.jsonl``).

This module owns both formats.  The sentinel writes it
(:meth:`AnomalyRecord.to_json`); ``verl-events triage`` reads it back
(:meth:`AnomalyRecord.from_json`).  A line looks like::

    {"run": "ray-session_…-01000000", "time": 1796025667.11, "step": 3, "stage": "actor_update",
     "rank": 0, "metric": "actor/grad_norm", "value": "nan", "rule": "non_finite", "baseline": null,
     "detail": "actor/grad_norm is nan"}

JSON has no NaN or infinity, so a non-finite ``value`` or ``baseline`` is the
string ``"nan"``, ``"inf"`` or ``"-inf"``.  A replay's verdict
(:class:`ReplayRecord`)::

    {"run": "…", "time": 1796025668.02, "step": 3, "stage": "actor_compute_log_prob", "rank": 1,
     "verdict": "reproducible", "anomalies": ["old_log_probs/nonfinite_count"],
     "again": {"old_log_probs/nonfinite_count": 12.0},
     "inputs": "step_3/actor_compute_log_prob.replay/inputs_rank1.pt"}

Standard library only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from verl_events import AnomalyEvent

__all__ = [
    "ANOMALY_LOG",
    "REPLAY_LOG",
    "AnomalyRecord",
    "NotAnAnomalyRecord",
    "ReplayRecord",
    "anomaly_log_path",
    "inputs_file_name",
    "record_files",
    "replay_log_path",
]

#: The file under ``save_path`` every rank appends its anomalies to.
ANOMALY_LOG = "anomalies.jsonl"
#: The file under ``save_path`` every rank appends its replays' verdicts to.
REPLAY_LOG = "replays.jsonl"
#: A replay's verdicts: the anomaly showed again, or it did not.
VERDICTS = ("reproducible", "transient")

_REQUIRED = ("step", "stage", "rank", "metric", "value", "rule")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def anomaly_log_path(save_path: Path) -> Path:
    """Where the sentinel appends a run's anomalies."""
    return Path(save_path) / ANOMALY_LOG


def replay_log_path(save_path: Path) -> Path:
    """Where the sentinel appends a run's replay verdicts."""
    return Path(save_path) / REPLAY_LOG


def record_files(save_path: Path) -> list[Path]:
    """The run's anomaly and replay logs under ``save_path``, those that exist."""
    return [path for path in (anomaly_log_path(save_path), replay_log_path(save_path)) if path.exists()]


def inputs_file_name(rank: int) -> str:
    """The file, in a replay's directory, holding the stage's tensor inputs on one rank."""
    return f"inputs_rank{rank}.pt"


class NotAnAnomalyRecord(ValueError):
    """A line that is not an anomaly record; the message says what it lacks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnomalyRecord(AnomalyEvent):
    """One anomaly as recorded: the :class:`~verl_events.AnomalyEvent` (its
    fields are this record's), plus the run that saw it (None in files older
    than run ids) and the Unix time it was recorded (None when unknown)."""

    run: str | None = None
    time: float | None = None

    @classmethod
    def from_event(cls, event: AnomalyEvent, *, run: str | None, time: float | None) -> AnomalyRecord:
        return cls(**{f.name: getattr(event, f.name) for f in fields(AnomalyEvent)}, run=run, time=time)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data, non-finite numbers as strings."""
        data = {name: getattr(self, name) for name in _KEY_ORDER}
        data["value"] = _encode(self.value)
        data["baseline"] = None if self.baseline is None else _encode(self.baseline)
        return data

    def to_json(self) -> str:
        """One line of anomalies.jsonl (no newline)."""
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json(cls, line: str) -> AnomalyRecord:
        """Parse one line.  ValueError when it is not JSON; NotAnAnomalyRecord
        (a ValueError too) when it lacks a field every reader needs, or its
        step and rank are not integers.  Keys it does not know are ignored."""
        data = json.loads(line)
        if not (
            isinstance(data, dict)
            and all(key in data for key in _REQUIRED)
            and isinstance(data["rank"], int)
            and isinstance(data["stage"], str)
            and (data["step"] is None or isinstance(data["step"], int))
        ):
            raise NotAnAnomalyRecord(f"not an anomaly record (needs {', '.join(_REQUIRED)}; step, rank integers)")
        try:
            value = _decode(data["value"])
            baseline = None if data.get("baseline") is None else _decode(data["baseline"])
        except (TypeError, ValueError):
            raise NotAnAnomalyRecord("not an anomaly record (its value and baseline must be numbers)") from None
        return cls(
            run=data.get("run"),
            time=data.get("time"),
            step=data["step"],
            stage=data["stage"],
            rank=data["rank"],
            metric=str(data["metric"]),
            value=value,
            rule=str(data["rule"]),
            baseline=baseline,
            detail=str(data.get("detail") or ""),
        )


# The line's keys: where and when first, then the event's own fields.
_KEY_ORDER = ("run", "time", *(f.name for f in fields(AnomalyEvent)))


def _encode(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def _decode(value: Any) -> float:
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRecord:
    """A replay's verdict on one rank: the stage's anomalies (``anomalies``:
    the metrics that raised one) showed again (``reproducible``; ``again``
    holds their values in the replay) or not (``transient``).  ``inputs`` is
    the stage's tensor inputs kept on disk, relative to save_path, or None."""

    run: str | None
    time: float | None
    step: int | None
    stage: str
    rank: int
    verdict: str
    anomalies: tuple[str, ...]
    again: dict[str, float]
    inputs: str | None = None

    def to_json(self) -> str:
        """One line of replays.jsonl (no newline)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["anomalies"] = list(self.anomalies)
        data["again"] = {metric: _encode(value) for metric, value in self.again.items()}
        return json.dumps(data, allow_nan=False)

    @classmethod
    def from_json(cls, line: str) -> ReplayRecord:
        """Parse one line; ValueError when it is not one (the message says why)."""
        data = json.loads(line)
        if not isinstance(data, dict) or data.get("verdict") not in VERDICTS or not isinstance(data.get("rank"), int):
            raise ValueError(f"not a replay record (needs a verdict of {', '.join(VERDICTS)} and an integer rank)")
        return cls(
            run=data.get("run"),
            time=data.get("time"),
            step=data.get("step"),
            stage=str(data["stage"]),
            rank=data["rank"],
            verdict=data["verdict"],
            anomalies=tuple(data.get("anomalies") or ()),
            again={str(k): _decode(v) for k, v in (data.get("again") or {}).items()},
            inputs=data.get("inputs"),
        )
