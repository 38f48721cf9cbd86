"""The report as tables on a console: stages by step, stragglers, stages that
raised, the overhead per stage and tool, each observer's own hook time."""

from __future__ import annotations

from typing import Any

from ..overhead_table import DISTRUST, ratio_cell, render_overhead
from ..read.overhead import TRUSTED_MIN_N, ObserverHooks, StageOverhead
from ..read.ranks import rank_name
from ..tables import print_table
from .raised import RaisedStage, render_raised
from .steps import StageStep
from .stragglers import StageStragglers, render_stragglers

__all__ = ["render", "render_observer_hooks", "render_overhead"]


def render(
    rows: list[StageStep],
    overhead: list[StageOverhead],
    hooks: list[ObserverHooks],
    straggling: list[StageStragglers],
    raised: list[RaisedStage],
    console: Any,
    multi_rank: bool,
) -> None:
    """Every table of the report, in order (``raised`` and ``straggling`` only when there are any)."""
    from rich.table import Table

    table = Table(title="Stages by step (times in ms; slowest rank; % step: its share of the step's stage time)")
    columns = ["step", "stage", "body", "profiled by", "hooks", "% step", "ratio", "dump MB"]
    if multi_rank:
        columns += ["ranks", "slowest", "spread"]
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("stage", "profiled by") else "right", no_wrap=column == "stage"
        )
    for row in rows:
        cells = [
            str(row.step),
            row.stage,
            f"{row.body_s * 1e3:.1f}",
            ", ".join(row.profiled_by) or "-",
            f"{row.hooks_s * 1e3:.1f}" if row.profiled_by else "-",
            f"{row.step_share:.0%}",
            ratio_cell(row.ratio, row.baseline_n < TRUSTED_MIN_N),
            f"{row.dump_bytes / 1e6:.3f}" if row.dump_bytes else "-",
        ]
        if multi_rank:
            cells += [str(row.ranks), rank_name(row.slowest_rank, compact=True), f"{row.spread:.2f}x"]
        table.add_row(*cells)
    print_table(table, console)
    if any(row.ratio is not None and row.baseline_n < TRUSTED_MIN_N for row in rows):
        console.print(f"* the stage's unprofiled median is of fewer than {TRUSTED_MIN_N} records: {DISTRUST}")
    render_raised(raised, console)  # none when no stage raised
    render_stragglers(straggling, console)  # none with one rank
    render_overhead(overhead, console)
    render_observer_hooks(hooks, console)


def render_observer_hooks(hooks: list[ObserverHooks], console: Any) -> None:
    """Each observer's own hook time per stage: who costs what."""
    from rich.table import Table

    table = Table(title="Each observer's own hook time per stage (begin + end, ms; all ranks and steps)")
    for column in ("observer", "stage", "median", "max", "n"):
        names = column in ("observer", "stage")
        table.add_column(column, justify="left" if names else "right", no_wrap=names)
    for row in hooks:
        table.add_row(row.observer, row.stage, f"{row.median_s * 1e3:.3f}", f"{row.max_s * 1e3:.3f}", str(row.n))
    print_table(table, console)
