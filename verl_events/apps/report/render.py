"""The report as tables on a console: stages by step, stragglers, stages that
raised, the overhead per stage and tool, each observer's own hook time."""

from __future__ import annotations

from typing import Any

from ..read.ranks import rank_name
from ..tables import print_table
from .overhead import IQR_MIN_N, TRUSTED_MIN_N, ObserverHooks, StageOverhead
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
            _ratio(row.ratio, row.baseline_n < TRUSTED_MIN_N),
            f"{row.dump_bytes / 1e6:.3f}" if row.dump_bytes else "-",
        ]
        if multi_rank:
            cells += [str(row.ranks), rank_name(row.slowest_rank, compact=True), f"{row.spread:.2f}x"]
        table.add_row(*cells)
    print_table(table, console)
    if any(row.ratio is not None and row.baseline_n < TRUSTED_MIN_N for row in rows):
        console.print(f"* the stage's unprofiled median is of fewer than {TRUSTED_MIN_N} records: {_DISTRUST}")
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


_DISTRUST = "too few to trust; record more steps, unprofiled ones for a baseline"


def render_overhead(overhead: list[StageOverhead], console: Any, title: str = "") -> None:
    """The overhead table: a row per stage and set of profiling observers,
    each median with its count and spread, on one line when the table fits
    the console and on two otherwise; then what the marks mean."""
    table = _overhead_table(overhead, title, wide=True)
    # Measured without the console's bound, which the measurement is clamped to.
    if console.measure(table, options=console.options.update(max_width=10_000)).maximum > console.width:
        table = _overhead_table(overhead, title, wide=False)
    print_table(table, console)
    if not overhead:
        return
    console.print(
        f"n: records over all ranks and steps; IQR: interquartile range (n >= {IQR_MIN_N}); "
        f"range: minimum to maximum (n < {IQR_MIN_N})"
    )
    if any(row.unprofiled_too_few or row.profiled_too_few for row in overhead):
        console.print(f"* fewer than {TRUSTED_MIN_N} records (a ratio: on either side): {_DISTRUST}")


def _overhead_table(overhead: list[StageOverhead], title: str, *, wide: bool) -> Any:
    from rich.table import Table

    table = Table(title=title or "Overhead per stage and tool (medians over all ranks and steps)")
    hooks = "of which hooks" if wide else "of which\nhooks"  # its rows are narrow: two lines of header
    columns = ("stage", "profiled by", "unprofiled ms", "profiled ms", hooks, "ratio", "MB/step", "MB total")
    for column in columns:
        # A stage's name stays on one line: the figures wrap (print_table cuts nothing).
        table.add_column(
            column, justify="left" if column in ("stage", "profiled by") else "right", no_wrap=column == "stage"
        )
    for row in overhead:
        table.add_row(
            row.stage,
            ", ".join(row.profiled_by) or "-",
            _figure(
                row.unprofiled_s,
                row.unprofiled_n,
                row.unprofiled_low_s,
                row.unprofiled_high_s,
                row.unprofiled_spread,
                row.unprofiled_too_few,
                wide,
            ),
            _figure(
                row.profiled_s,
                row.profiled_n,
                row.profiled_low_s,
                row.profiled_high_s,
                row.profiled_spread,
                row.profiled_too_few,
                wide,
            ),
            "-" if row.hooks_s is None else f"{row.hooks_s * 1e3:.1f}",
            _ratio(row.ratio, row.ratio_too_few),
            f"{row.dump_bytes_per_step / 1e6:.3f}" if row.profiled_n else "-",
            f"{row.dump_bytes / 1e6:.3f}" if row.profiled_n else "-",
        )
    return table


def _figure(
    median: float | None,
    n: int,
    low: float | None,
    high: float | None,
    spread: str | None,
    too_few: bool,
    wide: bool,
) -> str:
    """``12.3 (n=5, IQR 11.9-13.0)`` in ms, ``*`` after a median of too few
    records; narrow: the spread on a second line."""
    if median is None:
        return "-"
    head = f"{median * 1e3:.1f}{'*' if too_few else ''} (n={n}"
    if n < 2 or low is None or high is None:  # one record has no spread
        return head + ")"
    span = f"{'IQR' if spread == 'iqr' else 'range'} {_short_ms(low)}-{_short_ms(high)}"
    return f"{head}, {span})" if wide else f"{head})\n{span}"


def _short_ms(seconds: float) -> str:
    """Milliseconds to a tenth below 100 ms and whole above: a spread's ends
    need no more, and the cell stays narrow."""
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _ratio(ratio: float | None, too_few: bool) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x{'*' if too_few else ''}"
