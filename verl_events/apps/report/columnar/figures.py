"""The report's tables from the ``stage`` table (:mod:`.load`), each aggregated by DuckDB.

Each function gives what its record-by-record twin in the report gives
(:func:`~verl_events.apps.report.headline.headline`, :func:`~..steps.stage_steps`,
:func:`~..overhead.overhead_table`, :func:`~..overhead.observer_hooks`,
:func:`~..raised.raised_stages`), through the same row builders; what DuckDB does is the
part that grows with the records: the sums, counts, medians and quartiles over them.  Where
the record-by-record report takes "the first record" (of the logs' order: the first log,
then its lines), DuckDB takes the least ``(fidx, end_unix)``.
"""

from __future__ import annotations

from typing import Any

from ...read.overhead import ObserverHooks, StageOverhead, overhead_row, summary
from ...read.ranks import DRIVER_RANK, trainer_ranks
from ..headline import OUTSIDE_TRAINING, Headline
from ..raised import RaisedStage
from ..steps import STAGE_ORDER, StageStep

__all__ = ["FIRST", "headline", "observer_hooks", "overhead_table", "raised_stages", "stage_steps", "stage_order"]

#: The order key of a record: its log, then its line (see :mod:`.load`).
FIRST = "ord"


def stage_order(stages: set[str]) -> list[str]:
    return [s for s in STAGE_ORDER if s in stages] + sorted(stages - set(STAGE_ORDER))


def headline(con: Any, ranks: list[int], runs: list[str]) -> Headline:
    """The report's first line (see :mod:`..headline`), for the processes ``ranks``."""
    rows = con.execute(
        f"""
        SELECT stage, sum(elapsed + hook_total), sum(hook_total), min(end_unix - elapsed - hook_total),
               max(end_unix), min({FIRST}) AS seen
        FROM stage WHERE error IS NULL AND depth = 0 GROUP BY stage ORDER BY seen
        """
    ).fetchall()
    (steps,) = con.execute(
        "SELECT count(DISTINCT step) FROM stage WHERE NOT list_contains(?, stage)", [list(OUTSIDE_TRAINING)]
    ).fetchone()
    per_stage = {stage: seconds for stage, seconds, *_ in rows}
    total = sum(per_stage.values())
    hooks = sum(row[2] for row in rows)
    slowest = max(per_stage, key=lambda stage: per_stage[stage], default=None)
    run_share = None
    if rows:
        span = (max(row[4] for row in rows) - min(row[3] for row in rows)) * len(ranks)
        run_share = total / span if span > 0 else None
    return Headline(
        run=runs[0] if len(runs) == 1 else None,
        ranks=len(trainer_ranks(ranks)),
        driver=DRIVER_RANK in ranks,
        steps=steps,
        stage_s=total,
        slowest_stage=slowest,
        slowest_share=per_stage[slowest] / total if slowest is not None and total > 0 else 0.0,
        hooks_share=hooks / total if total > 0 else 0.0,
        run_share=run_share,
    )


def stage_steps(con: Any) -> list[StageStep]:
    """One row per (stage, step) (see :func:`..steps.stage_steps`)."""
    baseline = {
        stage: (median, n)
        for stage, median, n in con.execute(
            "SELECT stage, median(elapsed), count(*) FROM stage WHERE error IS NULL AND NOT profiled GROUP BY stage"
        ).fetchall()
    }
    groups = con.execute(
        f"""
        SELECT stage, step,
               arg_max(struct_pack(elapsed := elapsed, rank := rank, overhead := overhead),
                       struct_pack(e := elapsed, o := -ord)) AS slowest,
               min(elapsed), count(DISTINCT rank), bool_or(profiled),
               list_distinct(flatten(list(profilers) FILTER (WHERE profiled))),
               greatest(0.0, max(overhead)), sum(dump_bytes), min({FIRST}) AS seen
        FROM stage WHERE error IS NULL GROUP BY stage, step ORDER BY seen
        """
    ).fetchall()
    step_totals: dict[int | None, float] = {}
    for _, step, slowest, *_, hooks, _, _ in groups:
        step_totals[step] = step_totals.get(step, 0.0) + slowest["elapsed"] + hooks
    order = {stage: i for i, stage in enumerate(STAGE_ORDER)}
    rows = []
    for stage, step, slowest, fastest, ranks, profiled, profiled_by, hooks, dumped, _ in groups:
        base, n = baseline.get(stage, (None, 0))
        body = slowest["elapsed"]
        rows.append(
            StageStep(
                stage=stage,
                step=step,
                ranks=ranks,
                body_s=body,
                slowest_rank=slowest["rank"],
                spread=body / fastest if fastest > 0 else 1.0,
                profiled_by=tuple(sorted(profiled_by or ())),
                hooks_s=hooks,
                ratio=(body + slowest["overhead"]) / base if profiled and base else None,
                dump_bytes=int(dumped),
                baseline_n=n,
                step_share=(body + hooks) / step_totals[step] if step_totals[step] > 0 else 0.0,
            )
        )
    rows.sort(key=lambda r: (r.step is None, r.step or 0, order.get(r.stage, len(order)), r.stage))
    return rows


# One quantile state for the median and both quartiles (each state holds its values).
_SUMMARY = "count(*), quantile_cont({v}, [0.25, 0.5, 0.75]), min({v}), max({v})"


def overhead_table(con: Any) -> list[StageOverhead]:
    """Per stage and set of profiling observers (see :func:`..overhead.overhead_table`)."""
    stages = {stage for (stage,) in con.execute("SELECT DISTINCT stage FROM stage WHERE error IS NULL").fetchall()}
    base = {
        stage: _summary(n, q, low, high)
        for stage, n, q, low, high in con.execute(
            f"SELECT stage, {_SUMMARY.format(v='elapsed')} FROM stage WHERE error IS NULL AND NOT profiled "
            "GROUP BY stage"
        ).fetchall()
    }
    profiled: dict[str, list[tuple[tuple[str, ...], Any]]] = {}
    for stage, profilers, *figures in con.execute(
        f"""
        WITH firsts AS (
            SELECT stage, profilers, arg_min(elapsed + overhead, {FIRST}) AS first_s
            FROM stage WHERE error IS NULL AND profiled GROUP BY stage, profilers, rank
        ), by_profilers AS (
            SELECT stage, profilers, {_SUMMARY.format(v="elapsed + overhead")}, median(overhead),
                   sum(dump_bytes), count(DISTINCT step) + bool_or(step IS NULL)::INTEGER
            FROM stage WHERE error IS NULL AND profiled GROUP BY stage, profilers
        )
        SELECT p.*, f.first_s
        FROM by_profilers p JOIN (SELECT stage, profilers, median(first_s) AS first_s FROM firsts GROUP BY ALL) f
        USING (stage, profilers)
        """
    ).fetchall():
        profiled.setdefault(stage, []).append((tuple(profilers), figures))
    none = summary(0, None, None, None, None)
    rows = []
    for stage in stage_order(stages):
        for profilers, (n, q, low, high, hooks, dumped, steps, first_s) in sorted(
            profiled.get(stage, []), key=lambda item: item[0]
        ) or [((), (0, None, None, None, None, 0, 0, None))]:
            cost = _summary(n, q, low, high)
            rows.append(overhead_row(stage, profilers, base.get(stage, none), cost, hooks, int(dumped), steps, first_s))
    return rows


def _summary(n: int, quartiles: list[float] | None, low: float | None, high: float | None) -> Any:
    if not quartiles:
        return summary(n, None, None, low, high)
    return summary(n, quartiles[1], (quartiles[0], quartiles[2]), low, high)


def observer_hooks(con: Any, memory_bytes: int) -> list[ObserverHooks]:
    """Per observer and stage, its hook time (see :func:`..overhead.observer_hooks`).

    Every observer's hook times of every record: five times the records.  DuckDB's
    ``median()`` holds a group's values in memory, 8 bytes each, whatever its memory limit
    (``memory_bytes``); past a third of the limit the medians are taken instead by their
    place in the sorted values, a sort that spills to disk (ten times as long: 13 s for 40 M
    values on 2 cores)."""
    (values,) = con.execute(f"SELECT count(*) FROM ({_HOOK_TIMES})").fetchone()
    if values * 8 * 3 <= memory_bytes:
        query = f"SELECT observer, stage, count(*), median(s), max(s) FROM ({_HOOK_TIMES}) GROUP BY observer, stage"
        rows = con.execute(query).fetchall()
    else:
        rows = [
            (name, stage, n, (low + high) / 2 if n % 2 == 0 else low, top)  # as statistics.median
            for name, stage, n, low, high, top in con.execute(_SORTED_MEDIANS.format(values=_HOOK_TIMES)).fetchall()
        ]
    order = {stage: index for index, stage in enumerate(STAGE_ORDER)}
    rows.sort(key=lambda row: (row[0], order.get(row[1], len(order)), row[1]))
    return [ObserverHooks(name, stage, median, top, n) for name, stage, n, median, top in rows]


# Every observer's hook time of every stage that did not raise: a row per key of ``hook_s``.
_HOOK_TIMES = """
SELECT hook.key AS observer, stage, hook.value AS s
FROM (SELECT stage, unnest(map_entries(hook_s)) AS hook FROM stage WHERE error IS NULL)
WHERE hook.value IS NOT NULL
"""

# Each (observer, stage)'s count, its two middle values (one, for an odd count) and its largest.
_SORTED_MEDIANS = """
WITH ranked AS (
    SELECT observer, stage, s, row_number() OVER (PARTITION BY observer, stage ORDER BY s) AS i,
           count(*) OVER (PARTITION BY observer, stage) AS n
    FROM ({values})
)
SELECT observer, stage, n, max(s) FILTER (WHERE i = (n + 1) // 2), max(s) FILTER (WHERE i = n // 2 + 1),
       max(s) FILTER (WHERE i = n)
FROM ranked WHERE i IN ((n + 1) // 2, n // 2 + 1, n) GROUP BY observer, stage, n
"""


def raised_stages(con: Any) -> list[RaisedStage]:
    """The stages that raised (see :func:`..raised.raised_stages`)."""
    rows = con.execute(
        """
        SELECT stage, count(*), histogram(error), list(DISTINCT step), list(DISTINCT rank), bool_or(step IS NULL)
        FROM stage WHERE error IS NOT NULL GROUP BY stage
        """
    ).fetchall()
    by_stage = {row[0]: row for row in rows}
    raised = []
    for stage in stage_order(set(by_stage)):
        _, n, errors, steps, ranks, has_unknown = by_stage[stage]
        known = sorted(step for step in steps if step is not None)
        raised.append(
            RaisedStage(
                stage,
                n,
                dict(sorted(errors.items())),
                [*known, None] if has_unknown else known,
                sorted(rank for rank in ranks if rank is not None),
            )
        )
    return raised
