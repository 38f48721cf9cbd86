"""Memory by stage, from the memory observer's logs (``{RUN}/memory/rank*.jsonl``).

Per stage, over the records of stages that did not raise:

* the host peak (``host_peak_bytes``), taken per step as the largest over the
  ranks, then its median and largest over the steps, and where the largest was;
* the device peak the same way, when a device was there;
* what the stage **keeps**: its resident memory at its end less at its
  begin.  A stage that keeps ``LEAK_MIN_MB`` or more at nearly every step
  (all but one in ``LEAK_MIN_STEPS`` or more steps, its first step left
  out: a first step warms caches up) is flagged as a leak, with the median
  it keeps per step.  It is what a stage keeps, not how its begin figure
  grows, that names the stage: the host figures are the process's, so every
  stage that runs after a leaking one begins higher too.

No memory logs, no section.  Standard library only.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events.observers.memory import record as memory_record

from ..read.jsonl import read_records
from ..read.ranks import rank_name
from ..tables import print_table

__all__ = [
    "LEAK_MIN_MB",
    "LEAK_MIN_STEPS",
    "StageMemory",
    "StepMemory",
    "read_memory",
    "render_memory",
    "stage_memory",
    "stage_row",
]

#: Kept per step, MB, for a leak: far above the allocator's and Python's own wobble.
LEAK_MIN_MB = 10.0
#: Steps (after the first) that a leak must have been seen over.
LEAK_MIN_STEPS = 4
_MB = 2**20


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: str
    steps: int
    host_peak_median_mb: float
    host_peak_max_mb: float
    host_peak_max_step: int | None
    host_peak_max_rank: int
    device_peak_median_mb: float | None
    device_peak_max_mb: float | None
    kept_median_mb: float  # end - begin, per step (the largest over ranks), median over steps
    leak: bool


def read_memory(run: Path, warnings: list[str]) -> list[Any]:
    """Every memory record of ``run`` (a warning per line that is not one)."""
    records = []
    for path in memory_record.memory_files(run):
        records += [record for _, record in read_records(path, memory_record.MemoryRecord, warnings)]
    return records


@dataclass(frozen=True, slots=True)
class StepMemory:
    """One stage of one step over its ranks: the record of the largest host peak (the first
    such in the logs' order), the largest device peak (None when the step's first record has
    none), and the most a rank kept, MB (None unless every record has its begin and end)."""

    step: int | None
    host_peak_bytes: int
    host_peak_rank: int
    device_peak_bytes: int | None
    kept_mb: float | None


def stage_memory(records: list[Any], stage_order: list[str]) -> list[StageMemory]:
    """One row per stage (see the module docstring), stages of ``stage_order`` first."""
    by_stage: dict[str, dict[int | None, list[Any]]] = {}
    for record in records:
        if record.error is None and record.host_peak_bytes is not None:
            by_stage.setdefault(record.stage, {}).setdefault(record.step, []).append(record)
    order = [s for s in stage_order if s in by_stage] + sorted(set(by_stage) - set(stage_order))
    return [stage_row(stage, [_step(step, rs) for step, rs in by_stage[stage].items()]) for stage in order]


def _step(step: int | None, records: list[Any]) -> StepMemory:
    top = max(records, key=lambda r: r.host_peak_bytes)
    kept = None
    if all(r.host_end_bytes is not None and r.host_begin_bytes is not None for r in records):
        kept = max(r.host_end_bytes - r.host_begin_bytes for r in records) / _MB
    device = None
    if records[0].device_peak_bytes is not None:  # a rank without a device figure does not count
        device = max(r.device_peak_bytes for r in records if r.device_peak_bytes is not None)
    return StepMemory(step, top.host_peak_bytes, top.rank, device, kept)


def stage_row(stage: str, steps: list[StepMemory]) -> StageMemory:
    """One stage's row from its steps, in the order they first appear in the logs."""
    top = max(steps, key=lambda s: s.host_peak_bytes)
    device = [s.device_peak_bytes for s in steps if s.device_peak_bytes is not None]
    kept = {s.step: s.kept_mb for s in steps if s.kept_mb is not None}
    later = [mb for step, mb in sorted(kept.items(), key=lambda item: (item[0] is None, item[0] or 0))][1:]
    keeps = sum(mb >= LEAK_MIN_MB for mb in later)
    leak = len(later) >= LEAK_MIN_STEPS and keeps >= len(later) - 1 and statistics.median(later) >= LEAK_MIN_MB
    return StageMemory(
        stage=stage,
        steps=len(steps),
        host_peak_median_mb=statistics.median(s.host_peak_bytes for s in steps) / _MB,
        host_peak_max_mb=top.host_peak_bytes / _MB,
        host_peak_max_step=top.step,
        host_peak_max_rank=top.host_peak_rank,
        device_peak_median_mb=statistics.median(device) / _MB if device else None,
        device_peak_max_mb=max(device) / _MB if device else None,
        kept_median_mb=statistics.median(later or list(kept.values()) or [0.0]),
        leak=leak,
    )


def render_memory(rows: list[StageMemory], console: Any) -> None:
    """Memory by stage as a table, and a line per leak; nothing without memory logs."""
    if not rows:
        return
    from rich.table import Table

    device = any(row.device_peak_max_mb is not None for row in rows)
    table = Table(title="Memory by stage (MB; host peak: the process's resident peak, largest rank per step)")
    columns = ["stage", "steps", "host peak median", "host peak max", "at", "kept per step"]
    if device:
        columns += ["device peak median", "device peak max"]
    for column in columns:
        table.add_column(column, justify="left" if column == "stage" else "right", no_wrap=column == "stage")
    for row in rows:
        cells = [
            row.stage,
            str(row.steps),
            f"{row.host_peak_median_mb:.0f}",
            f"{row.host_peak_max_mb:.0f}",
            f"step {row.host_peak_max_step}, {rank_name(row.host_peak_max_rank)}",
            f"{row.kept_median_mb:+.1f}" + (" leak" if row.leak else ""),
        ]
        if device:
            cells += [_mb(row.device_peak_median_mb), _mb(row.device_peak_max_mb)]
        table.add_row(*cells)
    print_table(table, console)
    for row in rows:
        if row.leak:
            console.print(
                f"leak: {row.stage} keeps {row.kept_median_mb:.1f} MB more at each step (its memory at its end "
                "less at its begin, median over the steps after the first)",
                highlight=False,
            )


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
