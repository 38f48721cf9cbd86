"""The report's first line: the run in one sentence, before the tables.

Times are summed over the top-level stages of every rank and step (a nested stage, verl's
``train_batch`` inside ``actor_update``, is inside its parent's body already), each with its
hooks: that sum is the **stage time**, what the run spent inside stages.  A stage's share
and the observers' share are of it; the stage time's share of the **run time** (the first
stage's start to the last one's end, by the records' wall clock, times the ranks) says how
much of the run the stages cover.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..read.overhead import TimingRecord, runs_in
from ..read.ranks import DRIVER_RANK, trainer_ranks

__all__ = ["OUTSIDE_TRAINING", "Headline", "headline", "headline_text"]

#: Stages that run outside a training step too: verl syncs the starting weights (and validates,
#: with ``val_before_train``) as "step 0", or as the step a run resumes from.  The headline
#: counts a step only when some other stage ran in it, so a 3-step run says 3 steps.
OUTSIDE_TRAINING = ("load_checkpoint", "update_weights", "rollout_wake_up", "rollout_validate")


@dataclass(frozen=True, slots=True)
class Headline:
    """``stage_s``: the stage time, summed over ranks; ``slowest_stage`` and its
    ``slowest_share`` of it; ``hooks_share``: every observer's hooks over it;
    ``run_share``: stage time over run time (None without the wall clock); ``ranks``:
    the trainer ranks, and ``driver`` whether verl's driver has records too (its wait for
    generation: :mod:`verl_events.apps.read.ranks`)."""

    run: str | None
    ranks: int
    steps: int
    stage_s: float
    slowest_stage: str | None
    slowest_share: float
    hooks_share: float
    run_share: float | None
    driver: bool = False


def headline(records: list[TimingRecord], figures: list[TimingRecord]) -> Headline:
    """The headline of ``records`` (every record: run, ranks and steps) and ``figures``
    (those whose stage did not raise: the times)."""
    per_stage: dict[str, float] = {}
    hooks = 0.0
    for record in figures:
        if record.depth:
            continue
        own = sum(record.hook_s.values())
        hooks += own
        per_stage[record.stage] = per_stage.get(record.stage, 0.0) + record.elapsed_s + own
    total = sum(per_stage.values())
    slowest = max(per_stage, key=lambda stage: per_stage[stage], default=None)
    ranks = {r.rank for r in records}
    runs = runs_in(records)
    return Headline(
        run=runs[0] if len(runs) == 1 else None,
        ranks=len(trainer_ranks(ranks)),
        driver=DRIVER_RANK in ranks,
        steps=len({r.step for r in records if r.step is not None and r.stage not in OUTSIDE_TRAINING}),
        stage_s=total,
        slowest_stage=slowest,
        slowest_share=per_stage[slowest] / total if slowest is not None and total > 0 else 0.0,
        hooks_share=hooks / total if total > 0 else 0.0,
        run_share=_run_share(figures, total, len(ranks)),
    )


def _run_share(figures: list[TimingRecord], total: float, processes: int) -> float | None:
    ends = [r.end_unix for r in figures if r.end_unix is not None and not r.depth]
    if not ends or len(ends) < len([r for r in figures if not r.depth]):
        return None
    first = min(float(r.end_unix or 0.0) - r.elapsed_s - sum(r.hook_s.values()) for r in figures if not r.depth)
    span = (max(ends) - first) * processes
    return total / span if span > 0 else None


def headline_text(line: Headline) -> str:
    """``run run-1a2b: 2 ranks, 6 steps; stage time 4.21 s (93% of the run), the slowest
    stage actor_update 38% of it; observers' hooks 7.5%``."""
    run = f"run {line.run}" if line.run else "run"
    covered = "" if line.run_share is None else f" ({line.run_share:.0%} of the run)"
    slowest = f", the slowest stage {line.slowest_stage} {line.slowest_share:.0%} of it" if line.slowest_stage else ""
    ranks = f"{line.ranks} rank{'s' if line.ranks != 1 else ''}" + (" and the driver" if line.driver else "")
    return (
        f"{run}: {ranks}, {line.steps} step{'s' if line.steps != 1 else ''}; "
        f"stage time {line.stage_s:.2f} s{covered}{slowest}; observers' hooks {line.hooks_share:.1%}"
    )
