"""``verl-events report RUN``: what profiling cost, per stage and step, from disk alone.

Reads ``{RUN}/timing/rank*.jsonl`` (the timing observer's logs) and nothing
else, so it works on a copy of a run fetched from a cluster.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verl_events import STAGE_ROLES
from verl_events.layout import LATEST_LINK

from ..formats import msprobe_layout, timing_log
from ..tables import print_table
from .grouping import Key, StepGroup, index_records
from .overhead import (
    IQR_MIN_N,
    TRUSTED_MIN_N,
    ObserverHooks,
    StageOverhead,
    TimingLogError,
    TimingRecord,
    observer_hooks,
    overhead_table,
    profiled_seconds,
    read_timing_records,
    runs_in,
)
from .stragglers import StageStragglers, render_stragglers, stragglers
from .trace import chrome_trace

STAGE_ORDER = tuple(STAGE_ROLES)  # the order verl runs its stages in


class ReportError(TimingLogError):
    """The run directory cannot be reported on (the message says why)."""


@dataclass(frozen=True, slots=True)
class StageStep:
    """One stage of one step, over all ranks that ran it.  Times in seconds."""

    stage: str
    step: int | None
    ranks: int
    body_s: float  # the slowest rank's body time
    slowest_rank: int
    spread: float  # slowest / fastest body time (1.0 with one rank)
    profiled_by: tuple[str, ...]
    hooks_s: float  # the largest hook time of any rank
    ratio: float | None  # slowest rank's body + hooks over the stage's unprofiled median
    dump_bytes: int  # summed over ranks
    baseline_n: int  # the records of that unprofiled median (all ranks and steps)


def timing_files(run: Path) -> list[Path]:
    files = timing_log.timing_log_files(run)
    if not files and (run / LATEST_LINK).exists():
        raise ReportError(
            f"{run} holds runs, one folder each (save_path: .../{{run}}), not a run; "
            f"report one of them, e.g. the newest: verl-events report {run / LATEST_LINK}"
        )
    if not files:
        raise ReportError(
            f"{run} has no timing logs ({run / timing_log.TIMING_DIR}/rank*.jsonl); "
            "report needs a run recorded with the timing observer (name: timing)"
        )
    return files


def stage_steps(groups: dict[Key, StepGroup], baseline: dict[str, list[float]]) -> list[StageStep]:
    """One row per (stage, step) of :func:`.grouping.index_records`'s groups; ordered by
    step, then verl's stage order."""
    medians = {stage: statistics.median(times) for stage, times in baseline.items()}
    order = {stage: i for i, stage in enumerate(STAGE_ORDER)}
    rows = []
    for (stage, step), group in groups.items():
        slowest, base = group.slowest, medians.get(stage)
        rows.append(
            StageStep(
                stage=stage,
                step=step,
                ranks=group.ranks,
                body_s=slowest.elapsed_s,
                slowest_rank=slowest.rank,
                spread=slowest.elapsed_s / group.fastest_s if group.fastest_s > 0 else 1.0,
                profiled_by=tuple(sorted(group.profiled_by)),
                hooks_s=group.hooks_s,
                ratio=profiled_seconds(slowest) / base if group.profiled and base else None,
                dump_bytes=group.dump_bytes,
                baseline_n=len(baseline.get(stage, ())),
            )
        )
    rows.sort(key=lambda r: (r.step is None, r.step or 0, order.get(r.stage, len(order)), r.stage))
    return rows


def write_plot(overhead: list[StageOverhead], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ReportError("--plot needs matplotlib: pip install 'verl-events[plot]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{row.stage}\n{'+'.join(row.profiled_by) or '-'}" for row in overhead]
    x = range(len(overhead))
    fig, (times, disk) = plt.subplots(2, 1, figsize=(max(8, len(overhead) * 1.3), 8), sharex=True)
    base = [(r.unprofiled_s, r.unprofiled_low_s, r.unprofiled_high_s) for r in overhead]
    cost = [(r.profiled_s, r.profiled_low_s, r.profiled_high_s) for r in overhead]
    for offset, figures, label in ((-0.2, base, "unprofiled"), (0.2, cost, "profiled")):
        heights = [(median or 0) * 1e3 for median, _, _ in figures]
        below = [(median - low) * 1e3 if median is not None and low is not None else 0 for median, low, _ in figures]
        above = [(high - median) * 1e3 if median is not None and high is not None else 0 for median, _, high in figures]
        times.bar([i + offset for i in x], heights, 0.4, yerr=[below, above], capsize=3, label=f"{label} (median)")
    times.set_ylabel("ms per stage")
    times.set_yscale("symlog")
    times.legend()
    times.set_title("Stage time, profiled vs baseline (bars: IQR, or min-max below 4 records)")
    disk.bar(list(x), [r.dump_bytes_per_step / 1e6 for r in overhead], 0.6, color="tab:green")
    disk.set_ylabel("dump MB per profiled step")
    disk.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def as_json(
    run: Path,
    records: list[TimingRecord],
    rows: list[StageStep],
    overhead: list[StageOverhead],
    straggling: list[StageStragglers],
) -> str:
    return json.dumps(
        {
            "run": str(run),
            "records": len(records),
            "ranks": sorted({r.rank for r in records}),
            "stage_steps": [asdict(row) for row in rows],
            "overhead": [asdict(row) for row in overhead],
            "observer_hooks": [asdict(row) for row in observer_hooks(records, STAGE_ORDER)],
            "stragglers": [asdict(row) for row in straggling],
        },
        indent=1,
    )


def render(
    rows: list[StageStep],
    overhead: list[StageOverhead],
    hooks: list[ObserverHooks],
    straggling: list[StageStragglers],
    console: Any,
    multi_rank: bool,
) -> None:
    from rich.table import Table

    table = Table(title="Stages by step (times in ms; slowest rank)")
    columns = ["step", "stage", "body", "profiled by", "hooks", "ratio", "dump MB"]
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
            _ratio(row.ratio, row.baseline_n < TRUSTED_MIN_N),
            f"{row.dump_bytes / 1e6:.3f}" if row.dump_bytes else "-",
        ]
        if multi_rank:
            cells += [str(row.ranks), f"rank{row.slowest_rank}", f"{row.spread:.2f}x"]
        table.add_row(*cells)
    print_table(table, console)
    if any(row.ratio is not None and row.baseline_n < TRUSTED_MIN_N for row in rows):
        console.print(f"* the stage's unprofiled median is of fewer than {TRUSTED_MIN_N} records: {_DISTRUST}")
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


def report(
    run: Path,
    *,
    console: Any,
    as_json_output: bool = False,
    plot: Path | None = None,
    trace: Path | None = None,
    quiet: bool = False,
) -> str | None:
    """Run the report; return the JSON text when ``as_json_output``."""
    from rich.progress import Progress

    if not run.is_dir():
        raise ReportError(f"{run} is not a directory; pass the save_path of a run")
    files = timing_files(run)
    skipped: list[str] = []
    with Progress(console=console, transient=True, disable=quiet or len(files) < 8) as bar:
        task = bar.add_task("reading timing logs", total=len(files))
        records = read_timing_records(files, lambda: bar.advance(task), skipped)
    # A million acyclic records: a garbage collection that walks them (the first ones after
    # reading, and any full one) costs more than the report's own work, so they are left
    # out of collections (frozen) until the report is done.
    gc.freeze()
    try:
        return _report_records(run, records, skipped, console, as_json_output, plot, trace)
    finally:
        gc.unfreeze()


def _report_records(
    run: Path,
    records: list[TimingRecord],
    skipped: list[str],
    console: Any,
    as_json_output: bool,
    plot: Path | None,
    trace: Path | None,
) -> str | None:
    incomplete = [
        f"{path} is an incomplete msprobe session: {why}" for path, why in msprobe_layout.incomplete_sessions(run)
    ]
    for note in skipped + _mixed_runs(records) + incomplete:
        print(f"warning: {note}", file=sys.stderr)
    if not records:
        raise ReportError(f"{run / timing_log.TIMING_DIR} holds no stage records; nothing to report")
    groups, baseline = index_records(records)
    rows = stage_steps(groups, baseline)
    overhead = overhead_table(records, STAGE_ORDER)
    if plot is not None:
        write_plot(overhead, _output(plot, "--plot"))
    if trace is not None:
        _output(trace, "--trace").write_text(json.dumps(chrome_trace(records)))
    straggling = stragglers(records, STAGE_ORDER, groups)
    if as_json_output:
        return as_json(run, records, rows, overhead, straggling)
    hooks = observer_hooks(records, STAGE_ORDER)
    render(rows, overhead, hooks, straggling, console, multi_rank=len({r.rank for r in records}) > 1)
    return None


def _mixed_runs(records: list[TimingRecord]) -> list[str]:
    runs = runs_in(records)
    if len(runs) < 2:
        return []
    return [f"the timing logs hold records of {len(runs)} runs ({', '.join(runs)}); their figures are mixed"]


def _output(path: Path, flag: str) -> Path:
    """``path`` with its parent directories created, or ReportError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"{flag} {path}: its directory cannot be created ({exc.strerror or exc})") from exc
    return path
