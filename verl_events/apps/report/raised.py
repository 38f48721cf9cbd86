"""Stages that raised: counted per stage, and kept out of every figure of the report.

A stage whose body raised (its timing record's ``error`` names the exception
type) stopped part way, or waited for a peer that had died: its time says
nothing of what the stage costs.  The report leaves those records out of its
medians, ratios, stragglers and hook times (:func:`split_raised`) and shows
how many there were per stage instead (:func:`raised_stages`).  The
``--trace`` timeline keeps them: that is where a stage was when it failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..read.overhead import TimingRecord, by_stage
from ..read.ranks import DRIVER_RANK
from ..tables import print_table

__all__ = ["RaisedStage", "raised_stages", "render_raised", "split_raised"]


@dataclass(frozen=True, slots=True)
class RaisedStage:
    """The records of one stage that raised, over all ranks and steps: how many
    (``n``), how many of each exception type (``errors``, by type name), and
    the steps and ranks they were at (sorted; an unknown step is None, last)."""

    stage: str
    n: int
    errors: dict[str, int]
    steps: list[int | None]
    ranks: list[int]


def split_raised(records: list[TimingRecord]) -> tuple[list[TimingRecord], list[TimingRecord]]:
    """``records`` as (those whose body returned, those whose body raised), each in file order."""
    raised = [record for record in records if record.error is not None]
    if not raised:
        return records, []
    return [record for record in records if record.error is None], raised


def raised_stages(raised: Iterable[TimingRecord], stage_order: Iterable[str] = ()) -> list[RaisedStage]:
    """One row per stage of the ``raised`` records: stages of ``stage_order`` first, in its order."""
    rows = []
    for stage, mine in by_stage(raised, stage_order):
        errors: dict[str, int] = {}
        for record in mine:
            errors[str(record.error)] = errors.get(str(record.error), 0) + 1
        steps = sorted({r.step for r in mine}, key=lambda step: (step is None, step or 0))
        rows.append(RaisedStage(stage, len(mine), dict(sorted(errors.items())), steps, sorted({r.rank for r in mine})))
    return rows


def render_raised(rows: list[RaisedStage], console: Any) -> None:
    """The stages that raised, as a table; nothing when none did."""
    if not rows:
        return
    from rich.table import Table

    table = Table(title="Stages that raised (left out of every other table)")
    for column in ("stage", "raised", "errors", "steps", "ranks"):
        names = column in ("stage", "errors")
        table.add_column(column, justify="left" if names else "right", no_wrap=column == "stage")
    for row in rows:
        table.add_row(
            row.stage,
            str(row.n),
            ", ".join(f"{name} x{count}" for name, count in row.errors.items()),
            ", ".join(str(step) for step in row.steps),
            ", ".join("driver" if rank == DRIVER_RANK else str(rank) for rank in row.ranks),
        )
    print_table(table, console)
