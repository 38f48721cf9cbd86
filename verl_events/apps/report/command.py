"""The ``report`` command: its arguments, what it prints and its exit codes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NamedTuple

from verl_events.observers import timing as timing_log

from .. import shell
from ..read.overhead import TimingLogError
from ..read.record import Evidence
from ..tables import terminal_console
from ..tools import Holding
from .columnar import MEMORY_LIMIT
from .memory_line import memory_headline
from .memory_plot import MEMORY_PLOT, check_figure_path, run_memory_figure, write_figure
from .parts import ReportParts
from .render import SECTIONS, STEPS_SHOWN
from .steps import STAGE_ORDER
from .stragglers import stragglers
from .summary import COLUMNAR_FROM_BYTES, ENGINES, print_report, read_report, report_json, timing_files

__all__ = ["add_command", "command"]


#: The command's line in ``verl-events --help``; the others, what RUN is and what ``--json`` prints.
HELP = "stage times, profiling overhead and dump sizes of a run, from disk"
RUN_HELP = f"the run's save_path (holding {timing_log.TIMING_DIR}/rank*.jsonl)"
JSON_HELP = "print JSON instead of tables"


def add_command(commands: Any) -> None:
    """Add ``report`` to the ``verl-events`` parser's subcommands."""
    rep = shell.add_run_command(commands, "report", command, help=HELP, run=RUN_HELP, json_help=JSON_HELP)
    rep.add_argument("--plot", type=Path, help="write a PNG of stage time (profiled vs baseline) and disk per stage")
    rep.add_argument(
        MEMORY_PLOT,
        type=Path,
        metavar="PATH",
        help="write a figure (.png, .svg or .pdf) of each stage's host peak and begin, largest rank, over the steps "
        "(and its device peak), from the memory observer's logs",
    )
    rep.add_argument("--trace", type=Path, help="write a Chrome/Perfetto trace: a track per rank, a slice per stage")
    rep.add_argument("--quiet", action="store_true", help="no progress bar")
    rep.add_argument(
        "--only", choices=SECTIONS, help="print the headline and this section alone (e.g. memory: peaks by stage)"
    )
    rep.add_argument(
        "--all-steps",
        action="store_true",
        help=f"every step in the stages-by-step table (past {STEPS_SHOWN} steps it shows the first, the slowest "
        "and the last)",
    )
    rep.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="records: every record held in Python; duckdb: aggregated by DuckDB from the JSON lines, in bounded "
        f"memory (pip install 'verl-events[scale]'); auto (default): duckdb when installed, for timing logs of "
        f"{COLUMNAR_FROM_BYTES // 2**20} MiB or more, except with --trace",
    )
    rep.add_argument(
        "--duckdb-memory",
        default=MEMORY_LIMIT,
        metavar="SIZE",
        help=f"what DuckDB may hold in memory, past which it spills to a temporary folder (default {MEMORY_LIMIT})",
    )


def command(args: argparse.Namespace) -> int:
    """Stage times, overhead and dump sizes of a run, from its timing logs: 0, or 2 for a run it cannot read."""
    run, console = Path(args.run), terminal_console(stderr=False)
    return shell.run(
        args,
        lambda: _read(run, args, console),
        TimingLogError,
        text=lambda read: print_report(read.parts, console, only=args.only, all_steps=args.all_steps),
        as_json=lambda read: report_json(run, read.parts),
        after=lambda read: _finish(args, read.memory_figure),
    )


class _Read(NamedTuple):
    """The report's parts, and the ``--memory-plot`` figure when it is still to be written."""

    parts: ReportParts
    memory_figure: Any


def _read(run: Path, args: argparse.Namespace, console: Any) -> _Read:
    """The report read, its ``--plot`` and ``--trace`` written; the memory figure built first, so
    that a bad ``--memory-plot`` fails alone, and written before ``--json`` prints (the tables
    print as they are read, the figure after them)."""
    memory_figure = _memory_figure(run, args.memory_plot) if args.memory_plot is not None else None
    parts = read_report(
        run,
        console=console,
        plot=args.plot,
        trace=args.trace,
        quiet=args.quiet,
        engine=args.engine,
        duckdb_memory=args.duckdb_memory,
    )
    if memory_figure is not None and args.json:
        write_figure(memory_figure, args.memory_plot)
        memory_figure = None
    return _Read(parts, memory_figure)


def _finish(args: argparse.Namespace, memory_figure: Any) -> None:
    """The memory figure written, if it is still to be, and each file written named on stderr."""
    if memory_figure is not None:
        write_figure(memory_figure, args.memory_plot)
    for flag, path in (("--plot", args.plot), (MEMORY_PLOT, args.memory_plot), ("--trace", args.trace)):
        if path is not None and not args.quiet:
            print(f"{flag}: wrote {path}", file=sys.stderr)


def _memory_figure(run: Path, path: Path) -> Any:
    """The ``--memory-plot`` figure, built before the report prints anything, so that a bad
    option fails alone; None for a run that is not a directory (the report says so)."""
    check_figure_path(path)
    if not run.is_dir():
        return None
    timing_files(run)  # the report's own errors first: a folder of runs, a run without timing logs
    return run_memory_figure(run, list(STAGE_ORDER))


def headline(evidence: Evidence, holding: Holding) -> str:
    """The line in ``verl-events diagnose`` of the timing logs (records, ranks, stages that
    raised, stragglers) or of the memory logs (:mod:`.memory_line`): report reads both."""
    if holding.tool.observer == "memory":
        return memory_headline(evidence, holding)
    raised = f", {evidence.timing_errors} raised" if evidence.timing_errors else ""
    driver = " and the driver's" if evidence.timing_driver else ""
    if evidence.timing_tails_of:
        size = f"{evidence.timing_tails_of / 2**30:.2f} GiB"
        return (
            f"{evidence.timing_ranks} rank(s)'{driver} timing logs, {size}: their ends read for the stages that raised"
            f"{raised} (stage times and stragglers: report; every line: diagnose --read-all)"
        )
    slow = [
        f"rank(s) {', '.join(map(str, row.straggler_ranks))} in {row.stage}"
        for row in stragglers(evidence.timing)
        if row.straggler_ranks
    ]
    lagging = f"; stragglers: {'; '.join(slow)}" if slow else ""
    return (
        f"{evidence.timing_records} stage record(s) from {evidence.timing_ranks} rank(s)"
        f"{' and the driver' if evidence.timing_driver else ''}{raised}{lagging}"
    )


def suggestion(evidence: Evidence, holding: Holding) -> str | None:
    """``verl-events report RUN``, where it runs: report needs the timing logs, so a run with
    memory logs alone suggests nothing."""
    if holding.tool.observer == "memory" and not evidence.files(timing_log.timing_log_files):
        return None
    return f"verl-events report {evidence.run}"
