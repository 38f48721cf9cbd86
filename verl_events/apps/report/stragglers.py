"""Stragglers: which ranks are slow in a stage across the steps of a run, from its timing logs.

For each stage, each rank gets a **score**: its median time in the stage over its steps,
relative to the median rank's (the median of those medians).  nvidia-resiliency-ext scores
a section the same way, a rank's median time against a reference rank's, but against the
*fastest* rank and inverted (0.5: twice as slow as the fastest); over a thousand ranks the
fastest is an extreme of the distribution, while the median rank is the typical one, so a
score of 2.0 here reads "twice as slow as a typical rank".  The median rank is a rank
(the lower median with an even count): with two ranks the midpoint would be the mean of a
slow rank and a fast one, and a rank three times slower would score 1.5 instead of 3.

Each step is judged on its own: a rank is **slow** in a step when its time in the stage
(summed over its calls in that step) is at least :data:`SLOW_SCORE` times that step's
median rank's and at least :data:`MIN_EXCESS_S` longer.  A rank slow in at least
:data:`STRAGGLER_SHARE` of its steps, and in at least :data:`MIN_STRAGGLER_STEPS`, is a
**straggler**; one slow in fewer is a **hiccup** (a page fault, a checkpoint write, another
job on the node).  A rank whose extra time ended with the median rank's stage (at least
half of it before the median rank's end) **waited**: it began the stage early and spent the
difference in a collective waiting for a rank that was slow in an earlier stage; it is named
so, and not counted slow.  So is a rank above the line in a step where another rank's record
of the stage raised: it waited for the rank that failed (records that raised are never judged).

Profiled records are left out when the stage has unprofiled ones: a tool slows the ranks it
runs on, which is not what a straggler is.  Cost: nothing per record beyond the report's
shared pass (:mod:`.grouping`, in read order); then a sort of each step's ranks, and a
look at the records only of the steps where some rank was above the line.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..read.overhead import TimingRecord
from ..tables import print_table
from .grouping import Key, StepGroup, index_records
from .raised import split_raised

__all__ = [
    "MIN_EXCESS_S",
    "MIN_STRAGGLER_STEPS",
    "NAMED",
    "SLOW_SCORE",
    "STRAGGLER_SHARE",
    "RankScore",
    "StageStragglers",
    "render_stragglers",
    "stragglers",
]

#: A rank is slow in a step at this many times the step's median rank's time, or more.
SLOW_SCORE = 1.5
#: ... and at least this many seconds more.  On a loaded machine a rank waits tens of
#: milliseconds for a core now and then (the healthy two-rank CPU demo: up to 43 ms, and up
#: to 250 ms in its first step's all-reduce), which doubles a stage of a few ms; a verl
#: stage on a GPU lasts seconds, where 50 ms is nothing and the ratio decides.
MIN_EXCESS_S = 0.05
#: A straggler is slow in at least this share of its steps, ...
STRAGGLER_SHARE = 0.5
#: ... and in at least this many: one slow step is a hiccup, however short the run.
MIN_STRAGGLER_STEPS = 2
#: The slowest ranks named per stage in the table.
NAMED = 3


@dataclass(frozen=True, slots=True)
class RankScore:
    """One rank in one stage.  ``median_s``: its median time in the stage over its steps;
    ``score``: that over the median rank's (None when the median rank's is 0); ``steps``:
    the steps it ran the stage in; ``slow_steps`` and ``waited_steps``: those it was slow in,
    and those it took as long but waited (see the module docstring); ``worst_step`` and
    ``worst_ratio``: of those steps, the one furthest above the step's median rank, and how
    far (None without any); ``kind``: ``"straggler"``, ``"hiccup"``,
    ``"waited"`` or ``"-"``."""

    stage: str
    rank: int
    median_s: float
    score: float | None
    steps: int
    slow_steps: int
    waited_steps: int
    worst_step: int | None
    worst_ratio: float | None
    kind: str


@dataclass(frozen=True, slots=True)
class StageStragglers:
    """One stage over all its ranks: ``median_rank`` and its ``median_rank_s``; ``slowest``,
    the :data:`NAMED` ranks of highest score (only those above the median rank, or slow or
    waiting in a step); every straggler, hiccup and waiting rank by id, by score."""

    stage: str
    ranks: int
    steps: int
    median_rank: int
    median_rank_s: float
    slowest: tuple[RankScore, ...]
    straggler_ranks: tuple[int, ...]
    hiccup_ranks: tuple[int, ...]
    waited_ranks: tuple[int, ...]


def stragglers(
    records: Iterable[TimingRecord],
    stage_order: Iterable[str] = (),
    groups: dict[Key, StepGroup] | None = None,
    raised: Iterable[TimingRecord] = (),
) -> list[StageStragglers]:
    """Per stage run by two ranks or more, in ``stage_order`` then by name.  ``groups``:
    the records' :func:`.grouping.index_records` groups, when the caller has them already.

    A record whose body raised is never judged: it stopped part way.  Those among
    ``records`` (when ``groups`` is None) and ``raised`` set the line of their step,
    and the ranks above it there waited for the rank that raised (a collective that
    lost its peer), which makes them neither slow nor hiccups."""
    failed = list(raised)
    if groups is None:
        figures, more = split_raised(list(records))
        failed += more
        groups = index_records(figures)[0]
    peers_raised: dict[Key, dict[int, float]] = {}
    for record in failed:
        times = peers_raised.setdefault((record.stage, record.step), {})
        times[record.rank] = times.get(record.rank, 0.0) + record.elapsed_s
    by_stage: dict[str, dict[int | None, StepGroup]] = {}
    for (stage, step), group in groups.items():
        by_stage.setdefault(stage, {})[step] = group
    order = [s for s in stage_order if s in by_stage] + sorted(set(by_stage) - set(stage_order))
    rows = []
    for stage in order:
        steps = by_stage[stage]
        if any(group.unprofiled for group in steps.values()):  # a stage with unprofiled records: only those
            cells = {step: group.unprofiled for step, group in steps.items() if group.unprofiled}
        else:
            cells = {step: group.profiled for step, group in steps.items()}
        raised_in = {step: peers_raised[stage, step] for step in steps if (stage, step) in peers_raised}
        row = _judged(stage, cells, steps, raised_in)
        if row is not None:
            rows.append(row)
    return rows


def _judged(
    stage: str,
    steps: dict[int | None, dict[int, float]],
    groups: dict[int | None, StepGroup],
    raised: dict[int | None, dict[int, float]],
) -> StageStragglers | None:
    """One stage: who was above the line in which step, and whether they waited; then its row.
    ``raised``: by step, the seconds of each rank whose record there raised."""
    judged = Judged({}, {}, {})
    for step, cells in steps.items():
        failed = raised.get(step, {})
        if len(cells.keys() | failed.keys()) < 2:
            continue
        ordered = sorted([*cells.values(), *(s for rank, s in failed.items() if rank not in cells)])
        median = ordered[(len(ordered) - 1) // 2]  # the median rank's, a rank's (the lower median)
        line = line_of(median)
        if median <= 0 or ordered[-1] < line:
            continue
        last = groups[step].last
        typical = next((ends(last[rank]) for rank, seconds in cells.items() if seconds == median), None)
        above = [(rank, seconds, ends(last[rank])) for rank, seconds in cells.items() if seconds >= line]
        judge_step(step, above, median, typical, bool(failed), judged)
    times = _by_rank(steps)
    if len(times) < 2:
        return None
    medians = {rank: statistics.median(values) for rank, values in times.items()}
    counts = {rank: len(values) for rank, values in times.items()}
    return stage_row(stage, len(steps), medians, counts, judged.slow, judged.waited, judged.worst)


def line_of(median: float) -> float:
    """The time at or above which a rank is above the line in a step whose median rank took ``median``."""
    return max(median * SLOW_SCORE, median + MIN_EXCESS_S)


Ends = tuple[float | None, float]  # a rank's last record in a step: its end_unix, and its end hooks' seconds


def ends(record: TimingRecord) -> Ends:
    return record.end_unix, sum(record.hook_end_s.values())


@dataclass(frozen=True, slots=True)
class Judged:
    """What the steps of a stage found so far, per rank: steps slow in, steps waited in, and
    the worst ratio with its step."""

    slow: dict[int, int]
    waited: dict[int, int]
    worst: dict[int, tuple[float, int | None]]


def judge_step(
    step: int | None,
    above: list[tuple[int, float, Ends]],
    median: float,
    typical: Ends | None,
    failed: bool,
    judged: Judged,
) -> None:
    """One step where some rank was above the line: each such rank (``above``, in the order
    the ranks first appear in the step) was slow or waited.  ``typical``: the median rank's
    last record; ``failed``: a rank's record of the stage raised in this step."""
    for rank, seconds, last in above:
        ratio = seconds / median
        if ratio > judged.worst.get(rank, (0.0, None))[0]:
            judged.worst[rank] = (ratio, step)
        # A peer raised: this rank's extra time is its wait for the one that failed.
        if failed or (typical is not None and _waited(last, typical, seconds - median)):
            judged.waited[rank] = judged.waited.get(rank, 0) + 1
        else:
            judged.slow[rank] = judged.slow.get(rank, 0) + 1


def _by_rank(steps: dict[int | None, dict[int, float]]) -> dict[int, list[float]] | dict[int, tuple[float, ...]]:
    """Each rank's seconds over the steps.  Where every step has the same ranks in the same
    order (the logs are read a rank's file at a time) a transposition does it in C."""
    columns = list(steps.values())
    ranks = list(columns[0]) if columns else []
    if all(list(cells) == ranks for cells in columns):
        return dict(zip(ranks, zip(*(cells.values() for cells in columns), strict=True), strict=True))
    times: dict[int, list[float]] = {}
    for cells in columns:
        for rank, seconds in cells.items():
            times.setdefault(rank, []).append(seconds)
    return times


def stage_row(
    stage: str,
    steps: int,
    medians: dict[int, float],
    counts: dict[int, int],
    slow: dict[int, int],
    waited: dict[int, int],
    worst: dict[int, tuple[float, int | None]],
) -> StageStragglers:
    """One stage's row: ``medians``, each rank's median time over its ``counts`` steps (of
    ``steps``); ``slow``, ``waited`` and ``worst``, what :func:`_judged` found per rank."""
    median_rank, median_rank_s = sorted(medians.items(), key=lambda kv: (kv[1], kv[0]))[(len(medians) - 1) // 2]
    scores = []
    for rank, median_s in medians.items():
        ratio, step = worst.get(rank, (None, None))
        scores.append(
            RankScore(
                stage=stage,
                rank=rank,
                median_s=median_s,
                score=median_s / median_rank_s if median_rank_s > 0 else None,
                steps=counts[rank],
                slow_steps=slow.get(rank, 0),
                waited_steps=waited.get(rank, 0),
                worst_step=step,
                worst_ratio=ratio,
                kind=_kind(slow.get(rank, 0), waited.get(rank, 0), counts[rank]),
            )
        )
    scores.sort(key=lambda s: (-(s.score or 0.0), s.rank))
    named = [s for s in scores if (s.score or 0.0) > 1.0 or s.kind != "-"][:NAMED]
    return StageStragglers(
        stage=stage,
        ranks=len(medians),
        steps=steps,
        median_rank=median_rank,
        median_rank_s=median_rank_s,
        slowest=tuple(named),
        straggler_ranks=tuple(s.rank for s in scores if s.kind == "straggler"),
        hiccup_ranks=tuple(s.rank for s in scores if s.kind == "hiccup"),
        waited_ranks=tuple(s.rank for s in scores if s.kind == "waited"),
    )


def _waited(record: Ends, typical: Ends, excess: float) -> bool:
    """Whether most of ``record``'s ``excess`` over the median rank's record lies before the
    median rank's body ended: it began early and waited (as a collective makes it).  Without
    the wall clock (older logs) there is no telling: not waited."""
    if record[0] is None or typical[0] is None:
        return False
    late = _body_end(record) - _body_end(typical)
    return late < excess / 2


def _body_end(record: Ends) -> float:
    """When the body ended: the line is written after the end hooks."""
    return float(record[0] or 0.0) - record[1]


def _kind(slow: int, waited: int, steps: int) -> str:
    if slow >= MIN_STRAGGLER_STEPS and slow >= STRAGGLER_SHARE * steps:
        return "straggler"
    if slow:
        return "hiccup"
    return "waited" if waited else "-"


def render_stragglers(rows: list[StageStragglers], console: Any) -> None:
    """The slowest ranks of each stage and their kind; then each stage's stragglers,
    hiccups and waiting ranks by id (the first :data:`NAMED`, and how many more)."""
    from rich.table import Table

    if not rows:
        return
    table = Table(title="Slowest ranks per stage (score: median time over the median rank's; ms)")
    columns = ("stage", "rank", "score", "median", "median rank", "slow steps", "worst step", "kind")
    for column in columns:
        table.add_column(column, justify="left" if column in ("stage", "kind") else "right", no_wrap=column == "stage")
    for row in rows:
        for rank in row.slowest:
            table.add_row(
                row.stage,
                f"rank{rank.rank}",
                "-" if rank.score is None else f"{rank.score:.2f}x",
                f"{rank.median_s * 1e3:.1f}",
                f"rank{row.median_rank} {row.median_rank_s * 1e3:.1f}",
                f"{rank.slow_steps}/{rank.steps}" + (f" (+{rank.waited_steps} waited)" if rank.waited_steps else ""),
                "-" if rank.worst_step is None else f"{rank.worst_step}: {rank.worst_ratio:.2f}x",
                rank.kind,
            )
    print_table(table, console)
    console.print(
        f"slow in a step: >= {SLOW_SCORE}x the step's median rank and >= {MIN_EXCESS_S * 1e3:g} ms more; "
        f"straggler: slow in >= {STRAGGLER_SHARE:.0%} of its steps (>= {MIN_STRAGGLER_STEPS}); "
        "hiccup: slow in fewer; waited: as long, but ended with the median rank (a collective)"
    )
    for row in rows:
        found = [
            _ranks(kind, ranks)
            for kind, ranks in (
                ("straggler", row.straggler_ranks),
                ("hiccup", row.hiccup_ranks),
                ("waited", row.waited_ranks),
            )
            if ranks
        ]
        console.print(f"{row.stage}: {'; '.join(found) if found else 'no straggler'} (of {row.ranks} ranks)")


def _ranks(kind: str, ranks: tuple[int, ...]) -> str:
    shown = ", ".join(str(rank) for rank in ranks[:NAMED])
    more = f" and {len(ranks) - NAMED} more (--json lists them)" if len(ranks) > NAMED else ""
    plural = "s" if len(ranks) > 1 else ""
    if kind == "waited":
        return f"rank{plural} {shown}{more} waited for others"
    return f"{len(ranks)} {kind}{plural}: rank{plural} {shown}{more}"
