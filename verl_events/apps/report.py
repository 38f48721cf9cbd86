"""``verl-events report RUN``: what profiling cost, per stage and step, from disk alone.

Reads ``{RUN}/timing/rank*.jsonl`` (the timing observer's logs) and nothing
else, so it works on a copy of a run fetched from a cluster.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verl_events import STAGE_ROLES

from .formats import msprobe_layout, timing_log
from .overhead import (
    ObserverHooks,
    StageOverhead,
    TimingLogError,
    TimingRecord,
    observer_hooks,
    overhead_table,
    profiled_seconds,
    profilers,
    read_timing_records,
    runs_in,
)

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


def terminal_console(*, stderr: bool, quiet: bool = False) -> Any:
    """A rich console; when it writes to a pipe, wide enough for the tables
    (rich would assume 80 columns)."""
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, quiet=quiet, width=None if stream.isatty() else 120)


def timing_files(run: Path) -> list[Path]:
    files = timing_log.timing_log_files(run)
    if not files:
        raise ReportError(
            f"{run} has no timing logs ({run / timing_log.TIMING_DIR}/rank*.jsonl); "
            "report needs a run recorded with the timing observer (name: timing)"
        )
    return files


def stage_steps(records: list[TimingRecord]) -> list[StageStep]:
    """Group records by (stage, step); order by step, then verl's stage order."""
    baseline: dict[str, list[float]] = {}
    groups: dict[tuple[str, int | None], list[TimingRecord]] = {}
    for record in records:
        if not record.profiled:
            baseline.setdefault(record.stage, []).append(record.elapsed_s)
        groups.setdefault((record.stage, record.step), []).append(record)
    medians = {stage: statistics.median(times) for stage, times in baseline.items()}
    order = {stage: i for i, stage in enumerate(STAGE_ORDER)}
    rows = []
    for (stage, step), group in groups.items():
        slowest = max(group, key=lambda r: r.elapsed_s)
        fastest = min(r.elapsed_s for r in group)
        profiled = [r for r in group if r.profiled]
        base = medians.get(stage)
        rows.append(
            StageStep(
                stage=stage,
                step=step,
                ranks=len({r.rank for r in group}),
                body_s=slowest.elapsed_s,
                slowest_rank=slowest.rank,
                spread=slowest.elapsed_s / fastest if fastest > 0 else 1.0,
                profiled_by=tuple(sorted({name for r in profiled for name in profilers(r)})),
                hooks_s=max(r.overhead_s for r in group),
                ratio=profiled_seconds(slowest) / base if profiled and base else None,
                dump_bytes=sum(r.dump_bytes for r in group),
            )
        )
    rows.sort(key=lambda r: (r.step is None, r.step or 0, order.get(r.stage, len(order)), r.stage))
    return rows


def chrome_trace(records: list[TimingRecord]) -> dict[str, Any]:
    """A Chrome/Perfetto trace: one track per rank, a slice per stage, and
    inside it the observers' begin hooks, the body and their end hooks."""
    events: list[dict[str, Any]] = []
    for rank in sorted({r.rank for r in records}):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
    for record in records:
        begins, ends = record.hook_begin_s, record.hook_end_s
        total = sum(begins.values()) + record.elapsed_s + sum(ends.values())
        # Without the wall clock (older logs) the slices start at 0.
        start = ((total if record.end_unix is None else record.end_unix) - total) * 1e6
        common = {"ph": "X", "pid": record.rank, "tid": 0}
        args = {"step": record.step, "profiled_by": list(record.profiled_by), "dump_bytes": record.dump_bytes}
        events.append({**common, "name": record.stage, "ts": start, "dur": total * 1e6, "args": args})
        cursor = start
        # Older logs do not list the observers; those with a begin hook time did receive it.
        observers = list(begins if record.observers is None else record.observers)
        pieces = [(f"{name} begin", begins.get(name, 0.0)) for name in observers]
        pieces.append(("body", record.elapsed_s))
        pieces += [(f"{name} end", ends.get(name, 0.0)) for name in reversed(observers)]
        for name, seconds in pieces:
            events.append(
                {
                    **common,
                    "name": name,
                    "ts": cursor,
                    "dur": seconds * 1e6,
                    "cat": "hook" if name != "body" else "body",
                }
            )
            cursor += seconds * 1e6
    return {"traceEvents": events, "displayTimeUnit": "ms"}


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
    times.bar([i - 0.2 for i in x], [(r.unprofiled_s or 0) * 1e3 for r in overhead], 0.4, label="unprofiled (median)")
    times.bar([i + 0.2 for i in x], [(r.profiled_s or 0) * 1e3 for r in overhead], 0.4, label="profiled (median)")
    times.set_ylabel("ms per stage")
    times.set_yscale("symlog")
    times.legend()
    times.set_title("Stage time, profiled vs baseline")
    disk.bar(list(x), [r.dump_bytes_per_step / 1e6 for r in overhead], 0.6, color="tab:green")
    disk.set_ylabel("dump MB per profiled step")
    disk.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def as_json(run: Path, records: list[TimingRecord], rows: list[StageStep], overhead: list[StageOverhead]) -> str:
    return json.dumps(
        {
            "run": str(run),
            "records": len(records),
            "ranks": sorted({r.rank for r in records}),
            "stage_steps": [asdict(row) for row in rows],
            "overhead": [asdict(row) for row in overhead],
            "observer_hooks": [asdict(row) for row in observer_hooks(records, STAGE_ORDER)],
        },
        indent=1,
    )


def render(
    rows: list[StageStep], overhead: list[StageOverhead], hooks: list[ObserverHooks], console: Any, multi_rank: bool
) -> None:
    from rich.table import Table

    table = Table(title="Stages by step (times in ms; slowest rank)")
    columns = ["step", "stage", "body", "profiled by", "hooks", "ratio", "dump MB"]
    if multi_rank:
        columns += ["ranks", "slowest", "spread"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("stage", "profiled by") else "right")
    for row in rows:
        cells = [
            str(row.step),
            row.stage,
            f"{row.body_s * 1e3:.1f}",
            ", ".join(row.profiled_by) or "-",
            f"{row.hooks_s * 1e3:.1f}" if row.profiled_by else "-",
            f"{row.ratio:.2f}x" if row.ratio is not None else "-",
            f"{row.dump_bytes / 1e6:.3f}" if row.dump_bytes else "-",
        ]
        if multi_rank:
            cells += [str(row.ranks), f"rank{row.slowest_rank}", f"{row.spread:.2f}x"]
        table.add_row(*cells)
    console.print(table)
    render_overhead(overhead, console)
    render_observer_hooks(hooks, console)


def render_observer_hooks(hooks: list[ObserverHooks], console: Any) -> None:
    """Each observer's own hook time per stage: who costs what."""
    from rich.table import Table

    table = Table(title="Each observer's own hook time per stage (begin + end, ms; all ranks and steps)")
    for column in ("observer", "stage", "median", "max", "n"):
        table.add_column(column, justify="left" if column in ("observer", "stage") else "right")
    for row in hooks:
        table.add_row(row.observer, row.stage, f"{row.median_s * 1e3:.3f}", f"{row.max_s * 1e3:.3f}", str(row.n))
    console.print(table)


def render_overhead(overhead: list[StageOverhead], console: Any, title: str = "") -> None:
    """The overhead table: a row per stage and set of profiling observers."""
    from rich.table import Table

    table = Table(title=title or "Overhead per stage and tool (medians over all ranks and steps)")
    columns = ("stage", "profiled by", "unprofiled ms", "profiled ms", "of which hooks", "ratio", "MB/step", "MB total")
    for column in columns:
        table.add_column(column, justify="left" if column in ("stage", "profiled by") else "right")
    for row in overhead:
        table.add_row(
            row.stage,
            ", ".join(row.profiled_by) or "-",
            _ms(row.unprofiled_s, row.unprofiled_n),
            _ms(row.profiled_s, row.profiled_n),
            "-" if row.hooks_s is None else f"{row.hooks_s * 1e3:.1f}",
            f"{row.ratio:.2f}x" if row.ratio is not None else "-",
            f"{row.dump_bytes_per_step / 1e6:.3f}" if row.profiled_n else "-",
            f"{row.dump_bytes / 1e6:.3f}" if row.profiled_n else "-",
        )
    console.print(table)


def _ms(seconds: float | None, count: int) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} (n={count})"


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
    incomplete = [
        f"{path} is an incomplete msprobe session: {why}" for path, why in msprobe_layout.incomplete_sessions(run)
    ]
    for note in skipped + _mixed_runs(records) + incomplete:
        print(f"warning: {note}", file=sys.stderr)
    if not records:
        raise ReportError(f"{run / timing_log.TIMING_DIR} holds no stage records; nothing to report")
    rows = stage_steps(records)
    overhead = overhead_table(records, STAGE_ORDER)
    if plot is not None:
        write_plot(overhead, _output(plot, "--plot"))
    if trace is not None:
        _output(trace, "--trace").write_text(json.dumps(chrome_trace(records)))
    if as_json_output:
        return as_json(run, records, rows, overhead)
    render(rows, overhead, observer_hooks(records, STAGE_ORDER), console, multi_rank=len({r.rank for r in records}) > 1)
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
