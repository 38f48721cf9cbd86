"""The report of a large run, aggregated by DuckDB straight from its JSON lines.

A run of 1,024 ranks and 1,000 steps holds 8 million timing records and as many memory
records; held as Python objects they need some 3 KB each.  Here DuckDB reads the logs
(:mod:`.load`) and does the sums, counts, medians and quartiles (:mod:`.figures`,
:mod:`.stragglers`, :mod:`.memory`), held to a memory limit past which it spills to a
scratch folder; Python builds the same rows from the few figures that come back, with the
record-by-record report's own row builders.

Only this reading side imports DuckDB (the ``scale`` extra); the training processes never
do.  :func:`columnar_parts` raises :class:`~.load.NotColumnar` for logs it leaves to the
record-by-record report.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import tempfile
from pathlib import Path
from typing import Any

from ..memory import StageMemory, read_memory
from ..memory import stage_memory as record_memory
from ..parts import ReportParts
from ..steps import STAGE_ORDER
from .figures import headline, observer_hooks, overhead_table, raised_stages, stage_steps
from .load import (
    MEMORY_LIMIT,
    EngineFailed,
    NotColumnar,
    connect,
    load_memory,
    load_timing,
    memory_sources,
    size_bytes,
    timing_sources,
)
from .memory import stage_memory
from .sources import Sources
from .stragglers import stragglers

__all__ = [
    "MEMORY_LIMIT",
    "NEEDS",
    "EngineFailed",
    "NotColumnar",
    "available",
    "columnar_parts",
    "installed",
    "size_bytes",
]


#: The DuckDB this engine needs: its SQL uses 1.3's lambda syntax, and 1.3 will not read a link
#: in a permitted folder once a spill folder is set (:func:`.load.connect`); 1.4 does.
NEEDS = (1, 4)


def installed() -> str | None:
    """The installed DuckDB's version, or None."""
    if importlib.util.find_spec("duckdb") is None:
        return None
    return importlib.metadata.version("duckdb")


def available() -> bool:
    """Whether DuckDB :data:`NEEDS` or later is installed (``pip install 'verl-events[scale]'``)."""
    version = installed()
    return version is not None and tuple(int(part) for part in re.findall(r"\d+", version)[:2]) >= NEEDS


def columnar_parts(
    run: Path, files: list[Path], notes: list[str], memory_notes: list[str], memory_limit: str = MEMORY_LIMIT
) -> ReportParts:
    """The report's parts of ``run``, whose timing logs are ``files``; ``notes`` and
    ``memory_notes``: a sentence per line of the timing and the memory logs skipped.  The
    memory logs are read record by record when DuckDB cannot take them.  DuckDB holds at
    most ``memory_limit`` (ValueError for one that is not a size)."""

    import duckdb

    with tempfile.TemporaryDirectory(prefix="verl-events-report-") as scratch_name:
        scratch = Path(scratch_name)
        timing = timing_sources(files, scratch)
        memory: Sources | NotColumnar | None
        try:
            memory = memory_sources(run, scratch)
        except NotColumnar as exc:
            memory = exc
        readable = timing.targets + (memory.targets if isinstance(memory, Sources) else [])
        con = connect(scratch, readable, memory_limit)
        try:
            load_timing(con, timing, notes)
            return _figures(con, run, memory, memory_notes, memory_limit)
        except duckdb.OutOfMemoryException as exc:
            more = f"{2 * size_bytes(memory_limit) / 10**9:.3g}GB"
            raise EngineFailed(
                f"DuckDB needed more than --duckdb-memory {memory_limit} to report on {run} "
                f"({str(exc).splitlines()[0]}); give it more, e.g. --duckdb-memory {more}"
            ) from exc
        except duckdb.Error as exc:  # its scratch folder full, or gone
            raise EngineFailed(
                f"DuckDB failed reporting on {run}: {str(exc).splitlines()[0]} (it spills past its memory into "
                f"{scratch}: set TMPDIR to a folder with room)"
            ) from exc
        finally:
            con.close()


def _figures(
    con: Any, run: Path, memory: Sources | NotColumnar | None, memory_notes: list[str], memory_limit: str
) -> ReportParts:
    """The report's parts from the timing records loaded in ``con``, and the memory logs' rows."""
    (records,) = con.execute("SELECT count(*) FROM stage").fetchone()
    ranks = [rank for (rank,) in con.execute("SELECT DISTINCT rank FROM stage ORDER BY rank").fetchall()]
    runs = [
        run_id
        for (run_id, _) in con.execute(
            "SELECT run, min(ord) AS seen FROM stage WHERE run IS NOT NULL GROUP BY run ORDER BY seen"
        ).fetchall()
    ]
    if not records:
        return ReportParts(0, [], runs, headline(con, [], runs), [], [], [], [], [], [])
    memory_rows = _memory_rows(con, run, memory, memory_notes)
    return ReportParts(
        records=records,
        ranks=ranks,
        runs=runs,
        headline=headline(con, ranks, runs),
        stage_steps=stage_steps(con),
        overhead=overhead_table(con),
        observer_hooks=observer_hooks(con, size_bytes(memory_limit)),
        stragglers=stragglers(con),
        raised=raised_stages(con),
        memory=memory_rows,
    )


def _memory_rows(con: Any, run: Path, memory: Sources | NotColumnar | None, notes: list[str]) -> list[StageMemory]:
    """The memory table's rows: aggregated by DuckDB, or read record by record when DuckDB
    cannot take the memory logs (``memory`` is why)."""
    try:
        if isinstance(memory, NotColumnar):
            raise memory
        if memory is None:
            return []
        load_memory(con, memory, notes)
        return stage_memory(con)
    except NotColumnar as exc:
        notes[:] = [f"the memory logs are read record by record: {exc}"]
        return record_memory(read_memory(run, notes), list(STAGE_ORDER))
