"""The mismatch observer's log, ``{save_path}/mismatch.jsonl``: one line per step and rank.

This module owns the format; the observer writes it and ``verl-events
mismatch`` reads it back, both through the names here.  A line is a
:class:`MismatchRecord`: the stage's step, rank and run, and either
``stats`` (what :func:`~.tokens.measure` found) or ``missing`` (a sentence:
why that call could not be compared, such as a batch without
``rollout_log_probs``), and ``weights``: the weight versions the two sides
were computed with, where verl tagged the batch (:mod:`.versions`), else null::

    {"run": "ray-0a1b", "step": 2, "stage": "actor_compute_log_prob", "rank": 0, "time": 1796025667.1,
     "stats": {"tokens": 28, "nonfinite": 0, "log_prob": {"mean": 0.012, "p50": ..., "max": 0.31}, ...},
     "missing": null, "weights": {"trainer": 1, "rollout_min": 0, "rollout_max": 0}}

Lines are appended with one ``write`` on an ``O_APPEND`` descriptor, so the
ranks' lines never interleave.  Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events import Record

__all__ = [
    "ENGINE_STAGE",
    "MISMATCH_LOG",
    "TRAINER_STAGE",
    "NO_ROLLOUT_LOG_PROBS",
    "MismatchRecord",
    "NotAMismatchRecord",
    "mismatch_files",
    "mismatch_log_path",
]

MISMATCH_LOG = "mismatch.jsonl"
#: The stage the observer watches, where verl's trainer recomputes the rollout's log-probs;
#: its dump is the trainer's side of the layer profile.
TRAINER_STAGE = "actor_compute_log_prob"
#: The stage a rollout engine runs a step's sequences in for the layer profile; its dump is
#: the engine's side.
ENGINE_STAGE = "rollout_prefill"
#: ``missing`` of a batch without the rollout's log-probs: the one reason a setting cures.
NO_ROLLOUT_LOG_PROBS = "the batch carries no rollout_log_probs"


def mismatch_log_path(save_path: Path) -> Path:
    return Path(save_path) / MISMATCH_LOG


def mismatch_files(save_path: Path) -> list[Path]:
    """The run's mismatch log under ``save_path``, if it exists."""
    log = mismatch_log_path(save_path)
    return [log] if log.exists() else []


class NotAMismatchRecord(ValueError):
    """A line that is not a mismatch record; the message says what it lacks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MismatchRecord(Record):
    """One step's comparison on one rank (see the module docstring)."""

    run: str
    step: int | None
    stage: str
    rank: int
    time: float
    stats: dict[str, Any] | None = None
    missing: str | None = None
    weights: dict[str, int] | None = None

    noun = "a mismatch record"
    refused = NotAMismatchRecord
    required = ("run", "step", "stage", "rank", "time")
    numbers = ("stats", "weights")  # a statistic may be NaN (log-probs that are)

    @classmethod
    def from_json(cls, line: str | bytes) -> MismatchRecord:
        data = cls.parsed(line)
        stats = data.get("stats")
        if stats is not None and not (isinstance(stats, dict) and isinstance(stats.get("tokens"), int)):
            raise NotAMismatchRecord("its stats are not a mapping with a token count")
        weights = data.get("weights")
        if weights is not None and not (
            isinstance(weights, dict)
            and set(weights) == set(_WEIGHT_KEYS)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in weights.values())
        ):
            raise NotAMismatchRecord(f"its weights are not a mapping of {', '.join(_WEIGHT_KEYS)} to whole numbers")
        return cls.known(data)


_WEIGHT_KEYS = ("trainer", "rollout_min", "rollout_max")
