"""The report as tables on a console: stages by step, stragglers, stages that
raised, the overhead per stage and tool, each observer's own hook time, and memory.

A long run's stages-by-step table grows with steps x stages (538 rows at 64 ranks x 50
steps): past :data:`STEPS_SHOWN` steps it shows the first step, the slowest ones and the
last ones, and says which it left out (``--all-steps`` shows every row; ``--json`` holds
them all).  ``--only SECTION`` prints the headline and that section alone."""

from __future__ import annotations

from typing import Any

from ..overhead_table import DISTRUST, ratio_cell, render_overhead
from ..read.overhead import TRUSTED_MIN_N, ObserverHooks
from ..read.ranks import number_ranges, rank_name
from ..tables import print_table
from .memory import render_memory
from .parts import ReportParts
from .raised import render_raised
from .steps import StageStep
from .stragglers import render_stragglers

__all__ = ["SECTIONS", "STEPS_SHOWN", "render", "render_observer_hooks", "render_overhead"]

#: The report's sections, in the order it prints them; ``--only`` takes one.
SECTIONS = ("steps", "raised", "stragglers", "overhead", "hooks", "memory")
#: Steps of the stages-by-step table past which it is folded (see the module docstring).
STEPS_SHOWN = 8
#: Of a folded table: the slowest steps, and the last ones, shown besides the first.
_SLOWEST, _LAST = 3, 2


def render(parts: ReportParts, console: Any, *, only: str | None = None, all_steps: bool = False) -> None:
    """Every section of the report in :data:`SECTIONS` order, or the one ``only`` names
    (``raised``, ``stragglers`` and ``memory`` only when there are any)."""
    multi_rank = len(parts.ranks) > 1
    sections = {
        "steps": lambda: _render_steps(parts.stage_steps, console, multi_rank, all_steps),
        "raised": lambda: render_raised(parts.raised, console),
        "stragglers": lambda: render_stragglers(parts.stragglers, console),
        "overhead": lambda: render_overhead(parts.overhead, console),
        "hooks": lambda: render_observer_hooks(parts.observer_hooks, console),
        "memory": lambda: render_memory(parts.memory, console),
    }
    for name in SECTIONS if only is None else (only,):
        sections[name]()


def _render_steps(rows: list[StageStep], console: Any, multi_rank: bool, all_steps: bool) -> None:
    from rich.table import Table

    shown, left_out = (rows, []) if all_steps else _folded(rows)
    table = Table(title="Stages by step (times in ms; slowest rank; % step: its share of the step's stage time)")
    columns = ["step", "stage", "body", "profiled by", "hooks", "% step", "ratio", "dump MB"]
    if multi_rank:
        columns += ["ranks", "slowest", "spread"]
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("stage", "profiled by") else "right", no_wrap=column == "stage"
        )
    for row in shown:
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
    if left_out:
        console.print(
            f"{len(left_out)} step(s) left out ({number_ranges(left_out)}): the table shows the first, the "
            f"{_SLOWEST} slowest by stage time and the last {_LAST}; --all-steps shows every step (--json holds them)",
            highlight=False,
            soft_wrap=True,
        )
    if any(row.ratio is not None and row.baseline_n < TRUSTED_MIN_N for row in shown):
        console.print(f"* the stage's unprofiled median is of fewer than {TRUSTED_MIN_N} records: {DISTRUST}")


def _folded(rows: list[StageStep]) -> tuple[list[StageStep], list[int]]:
    """The rows of the steps a folded table shows, and the steps it leaves out (see the
    module docstring); every row when there are :data:`STEPS_SHOWN` steps or fewer.  The
    rows of stages without a step (a checkpoint save) are always shown."""
    steps = list(dict.fromkeys(row.step for row in rows if row.step is not None))
    if len(steps) <= STEPS_SHOWN:
        return rows, []
    time: dict[int, float] = {}
    for row in rows:
        if row.step is not None:
            time[row.step] = time.get(row.step, 0.0) + row.body_s
    slowest = sorted(steps, key=lambda step: -time[step])[:_SLOWEST]
    kept = {steps[0], *slowest, *steps[-_LAST:]}
    return [row for row in rows if row.step is None or row.step in kept], [s for s in steps if s not in kept]


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
