"""Stragglers from the ``stage`` table (see :mod:`verl_events.apps.report.stragglers`).

DuckDB sums each rank's time per stage and step (the cells), finds each step's median rank
(the lower median, an element: ``quantile_disc``) and its line, and each rank's median over
the steps.  Only the steps where a rank was above the line come back to Python, with those
ranks and the median rank, to be judged by the record-by-record report's own
:func:`~..stragglers.judge_step`; then :func:`~..stragglers.stage_row` makes each stage's
row.
"""

from __future__ import annotations

from typing import Any

from ..stragglers import MIN_EXCESS_S, SLOW_SCORE, Judged, StageStragglers, judge_step, stage_row
from .figures import stage_order

__all__ = ["stragglers"]

_CELLS = """
CREATE TEMP TABLE cells AS
WITH kinds AS (SELECT stage, bool_or(NOT profiled) AS by_unprofiled FROM stage WHERE error IS NULL GROUP BY stage)
SELECT s.stage, s.step, s.rank,
       sum(s.elapsed) FILTER (WHERE s.profiled <> k.by_unprofiled) AS seconds,
       min(s.ord) FILTER (WHERE s.profiled <> k.by_unprofiled) AS seen,
       min(s.ord) AS group_seen,
       arg_max(s.end_unix, s.ord) AS last_end, arg_max(s.hook_end, s.ord) AS last_hooks
FROM stage s JOIN kinds k USING (stage)
WHERE s.error IS NULL
GROUP BY s.stage, s.step, s.rank
"""

_STEPS = f"""
CREATE TEMP TABLE steps AS
WITH judged AS (SELECT * FROM cells WHERE seconds IS NOT NULL),
failed AS (SELECT stage, step, rank, sum(elapsed) AS seconds FROM stage WHERE error IS NOT NULL GROUP BY ALL),
extra AS (
    SELECT f.stage, f.step, f.seconds FROM failed f
    WHERE EXISTS (SELECT 1 FROM judged j WHERE j.stage = f.stage AND j.step IS NOT DISTINCT FROM f.step)
      AND NOT EXISTS (SELECT 1 FROM judged j WHERE j.stage = f.stage AND j.step IS NOT DISTINCT FROM f.step
                      AND j.rank = f.rank)
),
every AS (SELECT stage, step, seconds FROM judged UNION ALL SELECT stage, step, seconds FROM extra),
lines AS (
    SELECT stage, step, count(*) AS n, quantile_disc(seconds, 0.5) AS median, max(seconds) AS top
    FROM every GROUP BY stage, step
)
SELECT l.*, greatest(l.median * {SLOW_SCORE}, l.median + {MIN_EXCESS_S}) AS line,
       EXISTS (SELECT 1 FROM failed f WHERE f.stage = l.stage AND f.step IS NOT DISTINCT FROM l.step) AS failed
FROM lines l
"""


def stragglers(con: Any) -> list[StageStragglers]:
    """Per stage run by two ranks or more (see :func:`..stragglers.stragglers`)."""
    con.execute(_CELLS)
    con.execute(_STEPS)
    judged: dict[str, Judged] = {}
    above = con.execute(
        """
        SELECT s.stage, s.step, s.median, s.failed,
               list(struct_pack(rank := c.rank, seconds := c.seconds, end_unix := c.last_end, hook_end := c.last_hooks)
                    ORDER BY c.seen) FILTER (WHERE c.seconds >= s.line) AS above,
               arg_min(struct_pack(end_unix := c.last_end, hook_end := c.last_hooks), c.seen)
                   FILTER (WHERE c.seconds = s.median) AS typical,
               min(c.group_seen) AS group_seen
        FROM steps s JOIN cells c ON c.stage = s.stage AND c.step IS NOT DISTINCT FROM s.step
        WHERE c.seconds IS NOT NULL AND s.n >= 2 AND s.median > 0 AND s.top >= s.line
        GROUP BY s.stage, s.step, s.median, s.failed
        ORDER BY group_seen
        """
    ).fetchall()
    for stage, step, median, failed, ranks, typical, _ in above:
        found = judged.setdefault(stage, Judged({}, {}, {}))
        cells = [(r["rank"], r["seconds"], _ends(r)) for r in ranks or ()]
        judge_step(step, cells, median, None if typical is None else _ends(typical), failed, found)
    medians: dict[str, dict[int, tuple[float, int]]] = {}
    for stage, rank, median, n in con.execute(
        "SELECT stage, rank, median(seconds), count(*) FROM cells WHERE seconds IS NOT NULL GROUP BY stage, rank "
        "ORDER BY stage, min(seen)"
    ).fetchall():
        medians.setdefault(stage, {})[rank] = (median, n)
    steps = dict(
        con.execute(
            "SELECT stage, count(DISTINCT step) + bool_or(step IS NULL)::INTEGER FROM cells "
            "WHERE seconds IS NOT NULL GROUP BY stage"
        ).fetchall()
    )
    rows = []
    for stage in stage_order(set(medians)):
        ranks = medians[stage]
        if len(ranks) < 2:
            continue
        found = judged.get(stage, Judged({}, {}, {}))
        rows.append(
            stage_row(
                stage,
                steps[stage],
                {rank: m for rank, (m, _) in ranks.items()},
                {rank: n for rank, (_, n) in ranks.items()},
                found.slow,
                found.waited,
                found.worst,
            )
        )
    return rows


def _ends(last: dict[str, Any]) -> tuple[float | None, float]:
    return last["end_unix"], last["hook_end"]
