"""The memory table from the ``memory`` table (see :mod:`verl_events.apps.report.memory`):
DuckDB reduces each stage's records to one summary per step, and the report's own
:func:`~..memory.stage_row` makes each stage's row from them."""

from __future__ import annotations

from typing import Any

from ..memory import StageMemory, StepMemory, stage_row
from .figures import stage_order

__all__ = ["stage_memory"]

_MB = 2**20
_FIRST = "ord"  # the logs' order (see :mod:`.load`)


def stage_memory(con: Any) -> list[StageMemory]:
    """One row per stage of the memory logs' records of stages that did not raise."""
    steps: dict[str, list[StepMemory]] = {}
    for stage, step, top, device, has_device, whole, kept, _ in con.execute(
        f"""
        SELECT stage, step,
               arg_max(struct_pack(peak := host_peak_bytes, rank := rank),
                       struct_pack(p := host_peak_bytes, o := -ord)),
               max(device_peak_bytes), arg_min(device_peak_bytes IS NOT NULL, {_FIRST}),
               count(*) = count(host_end_bytes) AND count(*) = count(host_begin_bytes),
               max(host_end_bytes - host_begin_bytes), min({_FIRST}) AS seen
        FROM memory WHERE error IS NULL AND host_peak_bytes IS NOT NULL
        GROUP BY stage, step ORDER BY seen
        """
    ).fetchall():
        steps.setdefault(stage, []).append(
            StepMemory(step, top["peak"], top["rank"], device if has_device else None, kept / _MB if whole else None)
        )
    return [stage_row(stage, steps[stage]) for stage in stage_order(set(steps))]
