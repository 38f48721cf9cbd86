"""A run's timing and memory logs loaded into DuckDB tables, read from the JSON lines directly.

``stage``: a row per timing record; ``memory``: a row per memory record with its host and
device figures.  In both, ``ord`` orders the records as the logs do (the logs in their
order, each log's lines by the wall clock they were written at: ``end_unix``, ``time``).  The JSON
lines stay the source of truth: nothing is written beside them.

A run folder is untrusted input (many hosts wrote it, ``gather`` copied it, someone else
may have), so nothing read from it becomes SQL: every query's text is fixed here, whatever
the logs hold (the observers' hook times are one ``MAP`` column, not a column per observer
name), and values go in as parameters.  DuckDB is handed only paths this reader made
(:mod:`.sources`), and :func:`connect` locks the connection down before it reads a line.

A log DuckDB's reader cannot be trusted with is read by its owner and handed to DuckDB as a
copy of its good lines (:mod:`.sources`).  Only logs of a writer older than the
``observers`` and ``end_unix`` fields, or logs DuckDB cannot read even so, raise
:class:`NotColumnar`: the report then reads the run record by record.  Missing optional
fields take the record's defaults; a line that lacks only ``step`` reads as a step-less
stage (DuckDB cannot tell a missing key from a null).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from verl_events.events.record import latest_time
from verl_events.observers import timing as timing_log
from verl_events.observers.memory import record as memory_record

from ...read.jsonl import read_records
from ...read.overhead import read_timing_records
from .sources import NotColumnar, Sources

__all__ = [
    "MEMORY_LIMIT",
    "NotColumnar",
    "EngineFailed",
    "connect",
    "load_memory",
    "load_timing",
    "memory_sources",
    "timing_sources",
]

#: What DuckDB may hold in memory by default; past it, it spills to the scratch folder.
MEMORY_LIMIT = "1GB"
#: A memory limit as DuckDB takes it: a number and a unit.
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B)", re.IGNORECASE)
_POWERS = {"K": 1, "M": 2, "G": 3, "T": 4}
#: A record's place in the logs' order, as one number (cheaper to compare than a pair): its
#: log's index, then the wall clock its line was written at, to the microsecond (a log's
#: lines are written one after the other, further apart than that).
_ORD = "f.fidx::HUGEINT * 100000000000000000 + round({clock} * 1000000)::HUGEINT"

_TIMING_COLUMNS = {
    "run": "VARCHAR",
    # Read as JSON and converted in the query, so that a value of another type (a step
    # written as text, a stage as an object) is seen, not converted as DuckDB would.
    "stage": "JSON",
    "step": "JSON",
    "rank": "JSON",
    "depth": "BIGINT",
    "elapsed_s": "DOUBLE",
    "error": "VARCHAR",
    "profiled": "BOOLEAN",
    "profiled_by": "VARCHAR[]",
    "enclosed_by": "VARCHAR[]",
    "observers": "VARCHAR[]",
    "overhead_s": "DOUBLE",
    "end_unix": "DOUBLE",
    "dump_bytes": "BIGINT",
    # One map, whatever the observers are called: a column per name would put the names in
    # the query, and DuckDB's names ignore case where the logs' keys do not.
    "hook_s": "MAP(VARCHAR, DOUBLE)",
    "hook_end_s": "MAP(VARCHAR, DOUBLE)",
}
_MEMORY_COLUMNS = {
    "run": "VARCHAR",
    "stage": "VARCHAR",
    "step": "BIGINT",
    "rank": "BIGINT",
    "time": "DOUBLE",
    "error": "VARCHAR",
    "host_begin_bytes": "BIGINT",
    "host_peak_bytes": "BIGINT",
    "host_end_bytes": "BIGINT",
    "device_peak_bytes": "BIGINT",
    "pid": "BIGINT",
    "host_peak": "VARCHAR",
}


class EngineFailed(Exception):
    """DuckDB could not finish: past its memory limit (it holds the values of a median,
    8 bytes a record), or its scratch folder full; the message says which and what to do."""


def size_bytes(size: str) -> int:
    """A :data:`SIZE` in bytes, as DuckDB counts them (KB: 1,000; KiB: 1,024)."""
    found = SIZE.fullmatch(size.strip())
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(
            f"{size!r} is not a size: give a number above 0 and a unit (KB, MB, GB, TB, KiB ... TiB), e.g. 4GB"
        )
    unit = found.group(2)
    base = 1024 if unit[1].lower() == "i" else 1000
    return int(float(found.group(1)) * base ** _POWERS[unit[0].upper()])


def connect(scratch: Path, readable: list[str], memory_limit: str = MEMORY_LIMIT) -> Any:
    """A DuckDB connection held to ``memory_limit`` (:data:`SIZE`), spilling into ``scratch``,
    that may read the files ``readable`` and what lies in ``scratch``, and nothing else.

    Locked before it reads a line: no other file, no network, no extension installed or
    loaded, and no setting changed by a query afterwards."""
    import duckdb

    size_bytes(memory_limit)  # ValueError for one that is not a size
    con = duckdb.connect()
    for setting, value in (
        ("memory_limit", memory_limit),
        ("temp_directory", str(scratch / "spill")),
        ("threads", _cpus()),
        ("enable_progress_bar", False),
        ("autoinstall_known_extensions", False),
        ("autoload_known_extensions", False),
        ("allowed_directories", [str(scratch) + os.sep]),
        ("allowed_paths", readable),
        ("enable_external_access", False),
        ("lock_configuration", True),
    ):
        try:
            con.execute(f"SET {setting} = ?", [value])
        except duckdb.Error as exc:
            con.close()
            raise EngineFailed(
                f"DuckDB {duckdb.__version__} refused the setting {setting} ({str(exc).splitlines()[0]}); "
                "the report needs it to read a run folder safely"
            ) from exc
    return con


def _cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container's cpuset narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def timing_sources(files: list[Path], scratch: Path) -> Sources:
    """The timing logs ``files`` as DuckDB reads them (:mod:`.sources`)."""
    return Sources(files, timing_log.TimingRecord.from_json, _timing_skips, scratch / "timing_logs")


def memory_sources(run: Path, scratch: Path) -> Sources | None:
    """The run's memory logs as DuckDB reads them; None when there are none."""
    files = memory_record.memory_files(run)
    if not files:
        return None
    return Sources(files, memory_record.MemoryRecord.from_json, _memory_skips, scratch / "memory_logs")


def load_timing(con: Any, sources: Sources, notes: list[str]) -> None:
    """The ``stage`` table from the timing logs; ``notes``: a sentence per log of what was
    skipped (as the record-by-record report says it)."""
    select = f"""
            SELECT f.fidx, {_ORD.format(clock="j.end_unix")} AS ord, j.run,
                   json_extract_string(j.stage, '$') AS stage, json_type(j.stage) AS stage_type,
                   TRY_CAST(j.step AS BIGINT) AS step, json_type(j.step) AS step_type,
                   TRY_CAST(j.rank AS BIGINT) AS rank, json_type(j.rank) AS rank_type,
                   coalesce(j.depth, 0) AS depth, j.elapsed_s AS elapsed, j.error, j.profiled,
                   list_concat(coalesce(j.profiled_by, []),
                               list_transform(coalesce(j.enclosed_by, []), lambda name: name || ' (around)'))
                       AS profilers,
                   coalesce(j.overhead_s, 0.0) AS overhead, j.end_unix, coalesce(j.dump_bytes, 0) AS dump_bytes,
                   j.observers IS NULL AS old,
                   -- A key twice in one object: Python keeps the last, DuckDB one or both by version.
                   len(map_keys(j.hook_s)) <> len(list_distinct(map_keys(j.hook_s)))
                       OR len(map_keys(j.hook_end_s)) <> len(list_distinct(map_keys(j.hook_end_s))) AS twice,
                   coalesce(list_sum(map_values(j.hook_s)), 0.0) AS hook_total,
                   coalesce(list_sum(map_values(j.hook_end_s)), 0.0) AS hook_end,
                   j.hook_s"""
    # Values no figure may use, as the owner's reader refuses them (timing.py, _wrong).
    latest = float(latest_time())  # a number of ours, never a value read from the run
    not_records = (
        "stage IS NULL OR rank IS NULL OR elapsed IS NULL OR profiled IS NULL OR NOT (elapsed BETWEEN 0 AND 1e12) "
        "OR NOT (overhead BETWEEN 0 AND 1e12) OR dump_bytes < 0 OR depth < 0 "
        f"OR NOT (coalesce(end_unix, 0) BETWEEN 0 AND {latest!r}) OR stage_type <> 'VARCHAR' "
        "OR rank_type NOT IN ('BIGINT', 'UBIGINT') "
        "OR (step_type IS NOT NULL AND (step IS NULL OR step_type NOT IN ('BIGINT', 'UBIGINT')))"
    )
    _load(con, sources, ("stage", "timing"), select, not_records, _TIMING_COLUMNS, "stage records")
    notes.extend(sources.notes)
    old, twice = con.execute(
        "SELECT count(*) FILTER (old OR end_unix IS NULL), count(*) FILTER (twice) FROM stage"
    ).fetchone()
    if old:
        raise NotColumnar(f"{old} line(s) of the timing logs are of a writer without observers or end_unix")
    if twice:
        raise NotColumnar(f"{twice} line(s) of the timing logs name an observer twice in hook_s or hook_end_s")


def load_memory(con: Any, sources: Sources, notes: list[str]) -> None:
    """The ``memory`` table from the memory logs (:func:`memory_sources`)."""
    select = f"""SELECT f.fidx, {_ORD.format(clock="j.time")} AS ord, j.* EXCLUDE (filename)"""
    latest = float(latest_time())  # as the owner's reader (Record) refuses a time past it
    not_records = (
        f"stage IS NULL OR rank IS NULL OR time IS NULL OR time > {latest!r} OR pid IS NULL OR host_peak IS NULL"
    )
    _load(con, sources, ("memory", "memory"), select, not_records, _MEMORY_COLUMNS, "memory records")
    notes.extend(sources.notes)


def _load(
    con: Any,
    sources: Sources,
    names: tuple[str, str],
    select: str,
    not_records: str,
    columns: dict[str, str],
    noun: str,
) -> None:
    """Make the table ``names[0]`` from the ``names[1]`` logs: ``select``'s columns of their
    lines (``j``) and files (``f``).  Those DuckDB cannot parse, or that hold lines
    ``not_records`` finds, are read by their owner and copied (:mod:`.sources`), and the
    table made again."""
    import duckdb

    table, kind = names  # the table, and the kind of log ("timing", "memory")
    create = f"""
        CREATE OR REPLACE TABLE {table} AS {select}
        FROM read_json(?, format = 'newline_delimited', compression = 'uncompressed', filename = true,
                       columns = {_columns(columns)}) j
        JOIN {kind}_files f USING (filename)
        """
    for attempt in (1, 2):
        _file_table(con, f"{kind}_files", sources)
        try:
            con.execute(create, [sources.names])
        except (duckdb.InvalidInputException, duckdb.ConversionException) as exc:
            unread = [
                i for i, path in enumerate(sources.names) if not sources.copied(i) and not _reads(con, path, columns)
            ]
            if attempt == 2 or not unread:
                said = str(exc).splitlines()[0]
                for made, log in zip(sources.names, sources.files, strict=True):
                    said = said.replace(made, str(log))  # name the log, not the link or copy read
                raise NotColumnar(f"DuckDB cannot read the {kind} logs ({said})") from exc
            for index in unread:
                sources.copy(index)
            continue
        bad = [i for (i,) in con.execute(f"SELECT DISTINCT fidx FROM {table} WHERE {not_records}").fetchall()]
        if not bad:
            return
        if attempt == 2 or any(sources.copied(i) for i in bad):
            raise NotColumnar(f"lines of {len(bad)} {kind} log(s) are not {noun}, even as their owner reads them")
        for index in bad:
            sources.copy(index)


def _reads(con: Any, path: str, columns: dict[str, str]) -> bool:
    """Whether DuckDB parses the log ``path`` (its columns only, as the table reads it).  Each
    column is hashed: a bare ``count(*)`` would not convert the values, and not fail on one
    of the wrong type."""
    import duckdb

    every_column = ", ".join(f'sum(hash("{name}"))' for name in columns)
    try:
        con.execute(
            f"SELECT count(*), {every_column} FROM read_json(?, format = 'newline_delimited', "
            f"compression = 'uncompressed', columns = {_columns(columns)})",
            [path],
        ).fetchone()
    except (duckdb.InvalidInputException, duckdb.ConversionException):
        return False
    return True


def _memory_skips(path: Path) -> list[str]:
    """What the report's memory reader says of a log's lines that are not records."""
    said: list[str] = []
    for _ in read_records(path, memory_record.MemoryRecord, said):
        pass
    return said


def _timing_skips(path: Path) -> list[str]:
    """What the report's timing reader says of a log's lines it skips; damage raises TimingLogError."""
    said: list[str] = []
    read_timing_records([path], skipped=said)
    return said


def _file_table(con: Any, name: str, sources: Sources) -> None:
    con.execute(f"CREATE OR REPLACE TABLE {name} (filename VARCHAR, fidx INTEGER)")
    con.executemany(f"INSERT INTO {name} VALUES (?, ?)", [(path, index) for index, path in enumerate(sources.names)])


def _columns(columns: dict[str, str]) -> str:
    """The ``columns`` argument of ``read_json``, from this module's own constants only."""
    return "{" + ", ".join(f"'{name}': '{kind}'" for name, kind in columns.items()) + "}"
