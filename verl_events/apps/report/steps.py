"""The report's first table: one row per stage and step, over all ranks that ran it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from verl_events import STAGE_ROLES

from ..read.overhead import profiled_seconds
from .grouping import Key, StepGroup

__all__ = ["STAGE_ORDER", "StageStep", "stage_steps"]

STAGE_ORDER = tuple(STAGE_ROLES)  # the order verl runs its stages in


@dataclass(frozen=True, slots=True)
class StageStep:
    """One stage of one step, over all ranks that ran it.  Times in seconds."""

    stage: str
    step: int | None
    ranks: int
    body_s: float  # the slowest rank's body time
    slowest_rank: int
    spread: float  # slowest / fastest body time (1.0 with one rank)
    profiled_by: tuple[str, ...]
    hooks_s: float  # the largest hook time of any rank
    ratio: float | None  # slowest rank's body + hooks over the stage's unprofiled median
    dump_bytes: int  # summed over ranks
    baseline_n: int  # the records of that unprofiled median (all ranks and steps)
    step_share: float  # body + hooks over the step's summed body + hooks (its share of the step)


def stage_steps(groups: dict[Key, StepGroup], baseline: dict[str, list[float]]) -> list[StageStep]:
    """One row per (stage, step) of :func:`.grouping.index_records`'s groups; ordered by
    step, then verl's stage order."""
    medians = {stage: statistics.median(times) for stage, times in baseline.items()}
    order = {stage: i for i, stage in enumerate(STAGE_ORDER)}
    rows = []
    step_totals: dict[int | None, float] = {}
    for (_, step), group in groups.items():
        step_totals[step] = step_totals.get(step, 0.0) + group.slowest.elapsed_s + group.hooks_s
    for (stage, step), group in groups.items():
        slowest, base = group.slowest, medians.get(stage)
        rows.append(
            StageStep(
                stage=stage,
                step=step,
                ranks=group.ranks,
                body_s=slowest.elapsed_s,
                slowest_rank=slowest.rank,
                spread=slowest.elapsed_s / group.fastest_s if group.fastest_s > 0 else 1.0,
                profiled_by=tuple(sorted(group.profiled_by)),
                hooks_s=group.hooks_s,
                ratio=profiled_seconds(slowest) / base if group.profiled and base else None,
                dump_bytes=group.dump_bytes,
                baseline_n=len(baseline.get(stage, ())),
                step_share=(slowest.elapsed_s + group.hooks_s) / step_totals[step] if step_totals[step] > 0 else 0.0,
            )
        )
    rows.sort(key=lambda r: (r.step is None, r.step or 0, order.get(r.stage, len(order)), r.stage))
    return rows
