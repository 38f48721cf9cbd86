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

from dataclasses import dataclass, fields
from pathlib import Path

from verl_events import AnomalyEvent, Record

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
class AnomalyRecord(AnomalyEvent, Record):
    """One anomaly as recorded: the :class:`~verl_events.AnomalyEvent` (its
    fields are this record's), plus the run that saw it (None in files older
    than run ids) and the Unix time it was recorded (None when unknown)."""

    run: str | None = None
    time: float | None = None

    noun = "an anomaly record"
    refused = NotAnAnomalyRecord
    required = _REQUIRED
    numbers = ("value", "baseline")

    @classmethod
    def from_event(cls, event: AnomalyEvent, *, run: str | None, time: float | None) -> AnomalyRecord:
        return cls(**{f.name: getattr(event, f.name) for f in fields(AnomalyEvent)}, run=run, time=time)

    @classmethod
    def from_json(cls, line: str | bytes) -> AnomalyRecord:
        """Parse one line; NotAnAnomalyRecord (a ValueError) when it is not JSON, lacks a
        field every reader needs, or its step and rank are not integers, or its value and
        baseline not numbers.  Keys it does not know are ignored."""
        data = cls.parsed(line)
        try:
            value = float(data["value"])
            baseline = None if data.get("baseline") is None else float(data["baseline"])
        except (TypeError, ValueError):
            raise NotAnAnomalyRecord("its value and baseline are not numbers") from None
        texts = {name: str(data.get(name) or "") for name in ("metric", "rule", "detail")}
        return cls.known(data | texts | {"value": value, "baseline": baseline})


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRecord(Record):
    """A replay's verdict on one rank: the stage's anomalies (``anomalies``:
    the metrics that raised one) showed again (``reproducible``; ``again``
    holds their values in the replay) or not (``transient``).  ``inputs`` is
    the stage's tensor inputs kept on disk, relative to save_path, or None."""

    run: str | None = None
    time: float | None = None
    step: int | None = None
    stage: str
    rank: int
    verdict: str
    anomalies: tuple[str, ...]
    again: dict[str, float]
    inputs: str | None = None

    noun = "a replay record"
    required = ("stage", "rank", "verdict")
    numbers = ("again",)
    choices = {"verdict": VERDICTS}

    @classmethod
    def from_json(cls, line: str | bytes) -> ReplayRecord:
        """Parse one line; ValueError when it is not one (the message says why)."""
        data = cls.parsed(line)
        again = data.get("again") or {}
        if not isinstance(again, dict) or not all(isinstance(v, (int, float)) for v in again.values()):
            raise ValueError("its again does not map metrics to numbers")
        anomalies = tuple(data.get("anomalies") or ())
        return cls.known(
            data
            | {
                "stage": str(data["stage"]),
                "anomalies": anomalies,
                "again": {str(k): float(v) for k, v in again.items()},
            }
        )
