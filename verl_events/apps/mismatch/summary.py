"""The mismatch observer's log, read back: per step, the trend, where, and the worst tokens.

Reads ``mismatch.jsonl`` under RUN through the format's owner
(:mod:`verl_events.observers.mismatch.record`).  Per step and rank it keeps
the observer's numbers as they are; across steps it gives the trend of the
mean and the largest ``|Δ log p|`` (each step's ranks pooled, the mean
weighted by their tokens); across the whole run it pools the by-position
and by-entropy bins (token-weighted means, largest max) and ranks every
kept token by ``|Δ log p|``.  Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_events.observers.mismatch import record as mismatch_record

from ..read.record import Evidence

MismatchRecord = mismatch_record.MismatchRecord

__all__ = ["MismatchInputError", "Summary", "read_records", "summarize"]

#: What fills ``rollout_log_probs``, for the message of a run without them.
SETTING = "actor_rollout_ref.rollout.calculate_log_probs=True"


class MismatchInputError(ValueError):
    """RUN cannot be read as a run the mismatch observer watched (exit 2); the message says why."""


@dataclass(slots=True)
class Summary:
    """What ``verl-events mismatch RUN`` prints (``--json``: :meth:`as_json`)."""

    run: Path
    steps: list[dict[str, Any]]  # one per (step, rank): the record's stats with its step and rank
    trend: list[dict[str, Any]]  # one per step: tokens, mean, max, p99 (largest over ranks)
    by_position: list[dict[str, Any]]
    by_entropy: list[dict[str, Any]]
    worst: list[dict[str, Any]]  # the top tokens of every step and rank, worst first
    missing: list[dict[str, Any]] = field(default_factory=list)  # calls that could not be compared
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "run": str(self.run),
            "steps": self.steps,
            "trend": self.trend,
            "by_position": self.by_position,
            "by_entropy": self.by_entropy,
            "worst": self.worst,
            "missing": self.missing,
        }


def read_records(run: Path) -> tuple[list[MismatchRecord], list[str]]:
    """The records of this run under ``run`` and a warning per line that is not one, or that
    is of another run."""
    evidence = Evidence.of_folder(run, MismatchInputError)
    records = evidence.records(mismatch_record.mismatch_log_path(run), MismatchRecord, MismatchInputError)
    if not records and not evidence.warnings:
        raise MismatchInputError(
            f"{run} has no {mismatch_record.MISMATCH_LOG}: no mismatch observer watched this run; "
            "add '- name: mismatch' to its observers (docs/mismatch.md)"
        )
    return records, evidence.warnings


def summarize(run: Path, *, top: int = 10) -> Summary:
    """The run's mismatch (see the module docstring); MismatchInputError when there is none to show."""
    records, warnings = read_records(run)
    compared = sorted((r for r in records if r.stats is not None), key=lambda r: (r.step or 0, r.rank))
    missing = [{"step": r.step, "rank": r.rank, "why": r.missing} for r in records if r.missing]
    if not compared:
        raise MismatchInputError(_nothing_compared(run, missing))
    steps = [{"step": r.step, "rank": r.rank, "weights": r.weights, **(r.stats or {})} for r in compared]
    return Summary(
        run=run,
        steps=steps,
        trend=_trend(steps),
        by_position=_pooled(steps, "by_position", ("start", "end")),
        by_entropy=_pooled(steps, "by_entropy", ("low", "high")),
        worst=_worst(steps, top),
        missing=missing,
        warnings=warnings,
    )


def _nothing_compared(run: Path, missing: list[dict[str, Any]]) -> str:
    """Why nothing in ``run`` could be compared: each reason with its steps, and the setting
    that fills ``rollout_log_probs`` only where their absence is the reason."""
    if not missing:
        return f"{run}'s {mismatch_record.MISMATCH_LOG} has no usable record"
    steps_by_reason: dict[str, set[str]] = {}
    for found in missing:
        steps_by_reason.setdefault(found["why"], set()).add(str(found["step"]))
    said = "; ".join(
        f"at step(s) {', '.join(sorted(steps, key=lambda s: (len(s), s)))}, {why}"
        for why, steps in steps_by_reason.items()
    )
    message = f"nothing to compare in {run}: {said}"
    if mismatch_record.NO_ROLLOUT_LOG_PROBS in steps_by_reason:
        message += (
            f". The rollout's log-probs are kept only with {SETTING}; with "
            "algorithm.rollout_correction.bypass_mode=True the trainer never recomputes them, and there is no "
            "actor_compute_log_prob to compare at"
        )
    return message


def _trend(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_step: dict[Any, list[dict[str, Any]]] = {}
    for row in steps:
        if "log_prob" in row:
            by_step.setdefault(row["step"], []).append(row)
    trend = []
    for step, rows in by_step.items():
        tokens = sum(r["tokens"] for r in rows)
        trend.append(
            {
                "step": step,
                "ranks": len(rows),
                "tokens": tokens,
                "mean": sum(r["log_prob"]["mean"] * r["tokens"] for r in rows) / max(tokens, 1),
                "p99": max(r["log_prob"]["p99"] for r in rows),
                "max": max(r["log_prob"]["max"] for r in rows),
            }
        )
    return trend


def _pooled(steps: Iterable[dict[str, Any]], key: str, place: tuple[str, str]) -> list[dict[str, Any]]:
    pooled: dict[tuple[Any, Any], dict[str, Any]] = {}
    for row in steps:
        for found in row.get(key) or ():
            where = (found[place[0]], found[place[1]])
            into = pooled.setdefault(
                where, {place[0]: where[0], place[1]: where[1], "tokens": 0, "sum": 0.0, "max": None}
            )
            if found["tokens"]:
                into["tokens"] += found["tokens"]
                into["sum"] += found["mean"] * found["tokens"]
                into["max"] = found["max"] if into["max"] is None else max(into["max"], found["max"])
    rows = []
    for into in pooled.values():
        total = into.pop("sum")
        into["mean"] = total / into["tokens"] if into["tokens"] else None
        rows.append(into)
    return rows


def _worst(steps: Iterable[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    tokens = [
        {"step": row["step"], "rank": row["rank"], **token, "delta": token["old"] - token["rollout"]}
        for row in steps
        for token in row.get("top") or ()
    ]
    tokens.sort(key=lambda token: abs(token["delta"]), reverse=True)
    return tokens[:top]
