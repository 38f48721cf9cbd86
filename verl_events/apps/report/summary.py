"""``verl-events report RUN``: what profiling cost, per stage and step, from disk alone.

Reads ``{RUN}/timing/rank*.jsonl`` (the timing observer's logs), and the
memory observer's ``{RUN}/memory/rank*.jsonl`` when there are any
(:mod:`.memory`), and nothing else, so it works on a copy of a run fetched
from a cluster.  Stages that
raised are counted apart and kept out of every figure (:mod:`.raised`).
"""

from __future__ import annotations

import contextlib
import gc
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from verl_events.layout import LATEST_LINK
from verl_events.observers import timing as timing_log
from verl_events.observers.msprobe import layout as msprobe_layout

from .. import shell
from ..read.overhead import (
    TimingLogError,
    TimingRecord,
    observer_hooks,
    overhead_table,
    read_timing_records,
    runs_in,
)
from ..read.record import not_a_folder
from . import columnar
from .grouping import index_records
from .headline import headline, headline_text
from .memory import StageMemory, read_memory, stage_memory
from .parts import ReportParts
from .plot import write_plot
from .raised import raised_stages, split_raised
from .render import render
from .steps import STAGE_ORDER, stage_steps
from .stragglers import stragglers
from .trace import chrome_trace

__all__ = [
    "COLUMNAR_FROM_BYTES",
    "ENGINES",
    "ReportError",
    "ReportParts",
    "as_json",
    "print_report",
    "read_report",
    "record_parts",
    "report",
    "report_json",
    "timing_files",
    "write_plot",
]


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
    from ..read.evidence import gather

    path.write_text(json.dumps(chrome_trace(records, gather(run).failures)))


def record_parts(records: list[TimingRecord], memory: list[StageMemory]) -> ReportParts:
    """The report's parts from every record, held in memory (the record-by-record engine)."""
    figures, failed = split_raised(records)
    groups, baseline = index_records(figures)
    return ReportParts(
        records=len(records),
        ranks=sorted({r.rank for r in records}),
        runs=runs_in(records),
        headline=headline(records, figures),
        stage_steps=stage_steps(groups, baseline),
        overhead=overhead_table(figures, STAGE_ORDER),
        observer_hooks=observer_hooks(figures, STAGE_ORDER),
        stragglers=stragglers(figures, STAGE_ORDER, groups, failed),
        raised=raised_stages(failed, STAGE_ORDER),
        memory=memory,
    )


def report_json(run: Path, parts: ReportParts) -> dict[str, Any]:
    """The report as JSON data (``--json`` prints it with ``indent=1``)."""
    return {
        "run": str(run),
        "headline": asdict(parts.headline),
        "records": parts.records,
        "ranks": parts.ranks,
        "stage_steps": [asdict(row) for row in parts.stage_steps],
        "overhead": [asdict(row) for row in parts.overhead],
        "observer_hooks": [asdict(row) for row in parts.observer_hooks],
        "stragglers": [asdict(row) for row in parts.stragglers],
        "raised": [asdict(row) for row in parts.raised],
        "memory": [asdict(row) for row in parts.memory],
    }


def as_json(run: Path, parts: ReportParts) -> str:
    """The report as JSON text."""
    return json.dumps(report_json(run, parts), indent=1)


#: The report's engines: ``records`` holds every record as a Python object; ``duckdb``
#: aggregates the JSON lines in DuckDB (:mod:`.columnar`); ``auto`` takes DuckDB, when it is
#: installed, for timing logs of :data:`COLUMNAR_FROM_BYTES` or more, and never for --trace.
ENGINES = ("auto", "records", "duckdb")
#: From this size of timing logs on, ``auto`` reads with DuckDB (some 70,000 stage records).
COLUMNAR_FROM_BYTES = 64 * 2**20


def report(
    run: Path,
    *,
    console: Any,
    as_json_output: bool = False,
    plot: Path | None = None,
    trace: Path | None = None,
    quiet: bool = False,
    engine: str = "auto",
    duckdb_memory: str = columnar.MEMORY_LIMIT,
) -> str | None:
    """Run the report (:func:`read_report`), then print its tables on ``console``, or return
    its JSON text when ``as_json_output``."""
    parts = read_report(
        run, console=console, plot=plot, trace=trace, quiet=quiet, engine=engine, duckdb_memory=duckdb_memory
    )
    if as_json_output:
        return as_json(run, parts)
    print_report(parts, console)
    return None


def read_report(
    run: Path,
    *,
    console: Any,
    plot: Path | None = None,
    trace: Path | None = None,
    quiet: bool = False,
    engine: str = "auto",
    duckdb_memory: str = columnar.MEMORY_LIMIT,
) -> ReportParts:
    """The report's parts of ``run``, its warnings printed as they are found, ``--trace`` and
    ``--plot`` written; ReportError for a run it cannot report on.  ``engine``: see
    :data:`ENGINES`; ``duckdb_memory``: what DuckDB may hold (past it, it spills to disk);
    ``console`` shows the progress (none when ``quiet``)."""
    from rich.progress import Progress

    if not run.is_dir():
        raise ReportError(not_a_folder(run))
    files = timing_files(run)
    try:
        columnar.size_bytes(duckdb_memory)
    except ValueError as exc:
        raise ReportError(f"--duckdb-memory {exc}") from exc
    size = sum(path.stat().st_size for path in files)
    parts: ReportParts | None = None
    if _columnar(engine, size, trace):
        try:
            parts = _report_columnar(run, files, size, console, duckdb_memory, quiet)
        except columnar.NotColumnar as exc:
            shell.warn(f"read record by record: {exc}")
        except columnar.EngineFailed as exc:
            raise ReportError(str(exc)) from exc
    if parts is None:
        skipped: list[str] = []
        with Progress(console=console, transient=True, disable=quiet or len(files) < 8) as bar:
            task = bar.add_task("reading timing logs", total=len(files))
            records = read_timing_records(files, lambda: bar.advance(task), skipped)
        # A million acyclic records: a garbage collection that walks them (the first ones after
        # reading, and any full one) costs more than the report's own work, so they are left
        # out of collections (frozen) until the report is done.
        gc.freeze()
        try:
            parts = _report_records(run, records, skipped, trace)
        finally:
            gc.unfreeze()
    if plot is not None:
        write_plot(parts.overhead, _output(plot, "--plot"))
    return parts


def _columnar(engine: str, size: int, trace: Path | None) -> bool:
    """Whether to read with DuckDB (see :data:`ENGINES`), or ReportError for an engine that cannot be had."""
    if engine not in ENGINES:
        raise ReportError(f"--engine {engine!r} is not an engine; use one of {', '.join(ENGINES)}")
    if engine == "records":
        return False
    if engine == "duckdb":
        if not columnar.available():
            found = columnar.installed()
            has = f"; this environment has DuckDB {found}" if found else ""
            needs = ".".join(map(str, columnar.NEEDS))
            raise ReportError(f"--engine duckdb needs DuckDB {needs} or later{has}: pip install 'verl-events[scale]'")
        if trace is not None:
            raise ReportError("--trace draws every record, which --engine duckdb never holds; use --engine records")
        return True
    return trace is None and columnar.available() and size >= COLUMNAR_FROM_BYTES


def _report_columnar(
    run: Path, files: list[Path], size: int, console: Any, memory_limit: str, quiet: bool
) -> ReportParts:
    skipped: list[str] = []
    memory_warnings: list[str] = []
    # A terminal shows what it waits for (tens of seconds at a thousand ranks); a pipe gets nothing.
    with (
        console.status(f"DuckDB reads {len(files)} timing log(s), {size / 2**30:.2f} GiB", spinner="dots")
        if not quiet
        else contextlib.nullcontext()
    ):
        parts = columnar.columnar_parts(run, files, skipped, memory_warnings, memory_limit)
    for note in skipped + mixed_runs(parts.runs) + _incomplete(run):
        shell.warn(note)
    if not parts.records:
        raise ReportError(f"{run / timing_log.TIMING_DIR} holds no stage records; nothing to report")
    for note in memory_warnings:
        shell.warn(note)
    return parts


def _incomplete(run: Path) -> list[str]:
    return [f"{path} is an incomplete msprobe session: {why}" for path, why in msprobe_layout.incomplete_sessions(run)]


def _report_records(run: Path, records: list[TimingRecord], skipped: list[str], trace: Path | None) -> ReportParts:
    for note in skipped + mixed_runs(runs_in(records)) + _incomplete(run):
        shell.warn(note)
    if not records:
        raise ReportError(f"{run / timing_log.TIMING_DIR} holds no stage records; nothing to report")
    if trace is not None:
        write_trace(run, records, _output(trace, "--trace"))
    memory_warnings: list[str] = []
    memory = stage_memory(read_memory(run, memory_warnings), list(STAGE_ORDER))
    for note in memory_warnings:
        shell.warn(note)
    return record_parts(records, memory)


def print_report(parts: ReportParts, console: Any, *, only: str | None = None, all_steps: bool = False) -> None:
    """The report's headline and tables on ``console``: every section, or the one ``only``
    names (:data:`~.render.SECTIONS`); the stages-by-step table folded unless ``all_steps``."""
    console.print(headline_text(parts.headline), highlight=False, soft_wrap=True)
    render(parts, console, only=only, all_steps=all_steps)
    if only == "memory" and not parts.memory:
        console.print("no memory logs in this run: the memory observer was not on", highlight=False)


def mixed_runs(runs: list[str]) -> list[str]:
    """A warning when the logs hold more than one run's records."""
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
