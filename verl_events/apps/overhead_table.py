"""The overhead table, shared by ``verl-events report`` and the demo's summary: a row per
stage and set of profiling observers, each median with its count and spread."""

from __future__ import annotations

from typing import Any

from .read.overhead import AROUND, IQR_MIN_N, TRUSTED_MIN_N, StageOverhead
from .tables import print_table

__all__ = ["DISTRUST", "ratio_cell", "render_overhead"]

DISTRUST = "too few to trust; record more steps, unprofiled ones for a baseline"


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
    if any(name.endswith(AROUND) for row in overhead for name in row.profiled_by):
        console.print(
            f"NAME{AROUND}: the stage ran inside another stage that NAME profiled (verl's train_batch inside "
            "actor_update): it is not unprofiled, and its time counts that session's cost"
        )
    if any(row.unprofiled_too_few or row.profiled_too_few for row in overhead):
        console.print(f"* fewer than {TRUSTED_MIN_N} records (a ratio: on either side): {DISTRUST}")


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
            ratio_cell(row.ratio, row.ratio_too_few),
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


def ratio_cell(ratio: float | None, too_few: bool) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x{'*' if too_few else ''}"
