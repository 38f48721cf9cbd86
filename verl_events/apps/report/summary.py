"""``verl-events report RUN``: what profiling cost, per stage and step, from disk alone.

Reads ``{RUN}/timing/rank*.jsonl`` (the timing observer's logs), and the
memory observer's ``{RUN}/memory/rank*.jsonl`` when there are any
(:mod:`.memory`), and nothing else, so it works on a copy of a run fetched
from a cluster.  Stages that
raised are counted apart and kept out of every figure (:mod:`.raised`).
"""

from __future__ import annotations

import gc
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from verl_events.layout import LATEST_LINK

from ..formats import msprobe_layout, timing_log
from .grouping import index_records
from .headline import headline, headline_text
from .memory import StageMemory, read_memory, render_memory, stage_memory
from .overhead import (
    StageOverhead,
    TimingLogError,
    TimingRecord,
    observer_hooks,
    overhead_table,
    read_timing_records,
    runs_in,
)
from .plot import write_plot
from .raised import RaisedStage, raised_stages, split_raised
from .render import render
from .steps import STAGE_ORDER, StageStep, stage_steps
from .stragglers import StageStragglers, stragglers
from .trace import chrome_trace

__all__ = ["ReportError", "as_json", "report", "timing_files", "write_plot"]


class ReportError(TimingLogError):
    """The run directory cannot be reported on (the message says why)."""


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


def write_trace(run: Path, records: list[TimingRecord], path: Path) -> None:
    """The ``--trace`` timeline: every record, the failed stages too, and what went wrong
    (exceptions, signals, killed ranks, hangs, anomalies) as ``verl-events diagnose`` reads it."""
    from ..diagnose.evidence import gather

    path.write_text(json.dumps(chrome_trace(records, gather(run).failures)))


def as_json(
    run: Path,
    records: list[TimingRecord],
    figures: list[TimingRecord],
    rows: list[StageStep],
    overhead: list[StageOverhead],
    straggling: list[StageStragglers],
    raised: list[RaisedStage],
    memory: list[StageMemory],
) -> str:
    """The report as JSON: ``records`` and ``ranks`` count every record, the
    tables are of ``figures`` (the records of stages that did not raise),
    ``raised`` counts the others per stage."""
    return json.dumps(
        {
            "run": str(run),
            "headline": asdict(headline(records, figures)),
            "records": len(records),
            "ranks": sorted({r.rank for r in records}),
            "stage_steps": [asdict(row) for row in rows],
            "overhead": [asdict(row) for row in overhead],
            "observer_hooks": [asdict(row) for row in observer_hooks(figures, STAGE_ORDER)],
            "stragglers": [asdict(row) for row in straggling],
            "raised": [asdict(row) for row in raised],
            "memory": [asdict(row) for row in memory],
        },
        indent=1,
    )


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
    figures, failed = split_raised(records)
    raised = raised_stages(failed, STAGE_ORDER)
    groups, baseline = index_records(figures)
    rows = stage_steps(groups, baseline)
    overhead = overhead_table(figures, STAGE_ORDER)
    if plot is not None:
        write_plot(overhead, _output(plot, "--plot"))
    if trace is not None:
        write_trace(run, records, _output(trace, "--trace"))
    straggling = stragglers(figures, STAGE_ORDER, groups, failed)
    memory_warnings: list[str] = []
    memory = stage_memory(read_memory(run, memory_warnings), list(STAGE_ORDER))
    for note in memory_warnings:
        print(f"warning: {note}", file=sys.stderr)
    if as_json_output:
        return as_json(run, records, figures, rows, overhead, straggling, raised, memory)
    hooks = observer_hooks(figures, STAGE_ORDER)
    console.print(headline_text(headline(records, figures)), highlight=False, soft_wrap=True)
    render(rows, overhead, hooks, straggling, raised, console, multi_rank=len({r.rank for r in records}) > 1)
    render_memory(memory, console)  # none without the memory observer's logs
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
