"""A run's timing and memory logs loaded into DuckDB tables, read from the JSON lines directly.

``stage``: a row per timing record; ``memory``: a row per memory record with its host and
device figures.  In both, ``ord`` orders the records as the logs do (the logs in their
order, each log's lines by the wall clock they were written at: ``end_unix``, ``time``).  The JSON
lines stay the source of truth: nothing is written beside them.

What DuckDB's reader cannot be trusted with goes elsewhere:

* a log whose last line is cut short (a crash mid-write) or is not a record: its lines
  are read by the format's owner, with the same warnings as the record-by-record report,
  and the good ones copied to a scratch file that DuckDB reads in its place;
* anything else (a line that is not JSON in the middle of a log, a line that is not a
  stage record, logs of a writer older than ``observers`` and ``end_unix``): :class:`NotColumnar`,
  and the report reads the run record by record instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...formats import memory_record, timing_log
from ..overhead import read_timing_records

__all__ = [
    "MEMORY_LIMIT",
    "NotColumnar",
    "OutOfMemory",
    "connect",
    "hook_names",
    "load_memory",
    "load_timing",
    "quoted",
]

#: What DuckDB may hold in memory by default; past it, it spills to the scratch folder.
MEMORY_LIMIT = "1GB"
#: A memory limit as DuckDB takes it: a number and a unit.
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)")
_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
#: A record's place in the logs' order, as one number (cheaper to compare than a pair): its
#: log's index, then the wall clock its line was written at, to the microsecond (a log's
#: lines are written one after the other, further apart than that).
_ORD = "f.fidx::HUGEINT * 100000000000000000 + round({clock} * 1000000)::HUGEINT"
#: The end of a log read to see whether its last line is whole.
_TAIL_BYTES = 64 * 2**10

_TIMING_COLUMNS = {
    "run": "VARCHAR",
    "stage": "VARCHAR",
    "step": "BIGINT",
    "rank": "BIGINT",
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
}


class NotColumnar(Exception):
    """The logs hold what only the record-by-record report reads; the message says what."""


class OutOfMemory(Exception):
    """DuckDB needed more than its memory limit (it holds the values of a median: 8 bytes a
    record); the message says where."""


def size_bytes(size: str) -> int:
    """A :data:`SIZE` in bytes, as DuckDB counts them (KB: 1,000; KiB: 1,024)."""
    found = SIZE.fullmatch(size)
    if found is None:
        raise ValueError(f"{size!r} is not a size: give a number and a unit (KB, MB, GB, TB), e.g. 4GB")
    return int(float(found.group(1)) * _UNITS[found.group(2)])


def connect(scratch: Path, memory_limit: str = MEMORY_LIMIT) -> Any:
    """A DuckDB connection held to ``memory_limit`` (:data:`SIZE`), spilling into ``scratch``."""
    import duckdb

    size_bytes(memory_limit)  # ValueError for one that is not a size
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute("SET temp_directory = ?", [str(scratch / "spill")])
    con.execute(f"SET threads = {max(1, os.cpu_count() or 1)}")
    con.execute("SET enable_progress_bar = false")
    return con


def load_timing(con: Any, files: list[Path], scratch: Path, notes: list[str]) -> None:
    """The ``stage`` table from the timing logs ``files``; ``notes``: a sentence per log of
    what was skipped (as the record-by-record report says it)."""
    import duckdb

    def skipped_of(path: Path, _: Callable[[str], Any]) -> list[str]:
        said: list[str] = []
        read_timing_records([path], skipped=said)  # the owner's reader, its words; damage raises
        return said

    sources = _sources(files, timing_log.TimingRecord.from_json, scratch / "timing_copies", notes, skipped_of)
    _file_table(con, "timing_files", sources)
    try:
        observers = _observers(con, sources)
        hooks = _struct(observers)
        columns = _TIMING_COLUMNS | {"hook_s": hooks, "hook_end_s": hooks}
        con.execute(
            f"""
            CREATE TABLE stage AS
            SELECT f.fidx, {_ORD.format(clock="j.end_unix")} AS ord, j.run, j.stage, j.step, j.rank, j.depth,
                   j.elapsed_s AS elapsed, j.error, j.profiled,
                   list_concat(j.profiled_by, list_transform(j.enclosed_by, lambda name: name || ' (around)'))
                       AS profilers,
                   j.overhead_s AS overhead, j.end_unix, j.dump_bytes, j.observers IS NULL AS old,
                   {_summed("j.hook_s", observers)} AS hook_total, {_summed("j.hook_end_s", observers)} AS hook_end,
                   j.hook_s
            FROM read_json(?, format = 'newline_delimited', filename = true, columns = {_columns(columns)}) j
            JOIN timing_files f USING (filename)
            """,
            [[str(path) for path in sources]],
        )
    except duckdb.OutOfMemoryException:
        raise
    except duckdb.Error as exc:
        raise NotColumnar(f"DuckDB cannot read the timing logs ({str(exc).splitlines()[0]})") from exc
    (foreign, old) = con.execute(
        "SELECT count(*) FILTER (WHERE stage IS NULL OR rank IS NULL OR elapsed IS NULL OR profiled IS NULL), "
        "count(*) FILTER (WHERE old OR end_unix IS NULL) FROM stage"
    ).fetchone()
    if foreign:
        raise NotColumnar(f"{foreign} line(s) of the timing logs are not stage records")
    if old:
        raise NotColumnar(f"{old} line(s) of the timing logs are of a writer without observers or end_unix")
    con.execute("CREATE TABLE hook_names AS SELECT unnest(?) AS observer", [observers])


def hook_names(con: Any) -> list[str]:
    """The observers whose hook times the timing logs hold."""
    return [name for (name,) in con.execute("SELECT observer FROM hook_names").fetchall()]


def load_memory(con: Any, run: Path, scratch: Path, notes: list[str]) -> bool:
    """The ``memory`` table from the run's memory logs; False when there are none."""
    import duckdb

    files = memory_record.memory_files(run)
    if not files:
        return False
    sources = _sources(files, memory_record.MemoryRecord.from_json, scratch / "memory_copies", notes, _memory_skips)
    _file_table(con, "memory_files", sources)
    try:
        con.execute(
            f"""
            CREATE TABLE memory AS
            SELECT f.fidx, {_ORD.format(clock="j.time")} AS ord, j.* EXCLUDE (filename)
            FROM read_json(?, format = 'newline_delimited', filename = true, columns = {_columns(_MEMORY_COLUMNS)}) j
            JOIN memory_files f USING (filename)
            """,
            [[str(path) for path in sources]],
        )
    except duckdb.OutOfMemoryException:
        raise
    except duckdb.Error as exc:
        raise NotColumnar(f"DuckDB cannot read the memory logs ({str(exc).splitlines()[0]})") from exc
    (foreign,) = con.execute(
        "SELECT count(*) FROM memory WHERE stage IS NULL OR rank IS NULL OR time IS NULL"
    ).fetchone()
    if foreign:
        raise NotColumnar(f"{foreign} line(s) of the memory logs are not memory records")
    return True


def _memory_skips(path: Path, parse: Callable[[str], Any]) -> list[str]:
    """What the report's memory reader says of a log's lines that are not records."""
    said = []
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if line.strip():
            try:
                parse(line)
            except ValueError as exc:
                said.append(f"{path}:{number}: not a memory record ({exc}); skipped")
    return said


def _sources(
    files: list[Path],
    parse: Callable[[str], Any],
    scratch: Path,
    notes: list[str],
    skips: Callable[[Path, Callable[[str], Any]], list[str]],
) -> list[Path]:
    """``files``, each whose last line is not a whole record replaced by a copy of its good lines."""
    sources = []
    for index, path in enumerate(files):
        if _last_line_whole(path, parse):
            sources.append(path)
            continue
        notes.extend(skips(path, parse))
        scratch.mkdir(parents=True, exist_ok=True)
        copy = scratch / f"{index}.jsonl"
        with copy.open("w", encoding="utf-8") as out:
            for line in path.read_text(encoding="utf-8").split("\n"):
                if line.strip() and _parses(line, parse):
                    out.write(line + "\n")
        sources.append(copy)
    return sources


def _last_line_whole(path: Path, parse: Callable[[str], Any]) -> bool:
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - _TAIL_BYTES))
        lines = [line for line in handle.read().split(b"\n") if line.strip()]
    return not lines or _parses(lines[-1].decode("utf-8", "replace"), parse)


def _parses(line: str, parse: Callable[[str], Any]) -> bool:
    try:
        parse(line)
    except ValueError:
        return False
    return True


def _file_table(con: Any, name: str, sources: list[Path]) -> None:
    con.execute(f"CREATE TABLE {name} (filename VARCHAR, fidx INTEGER)")
    con.executemany(f"INSERT INTO {name} VALUES (?, ?)", [(str(path), index) for index, path in enumerate(sources)])


def _observers(con: Any, sources: list[Path]) -> list[str]:
    """Every observer named by a record's ``observers``: the keys its hook times may have."""
    rows = con.execute(
        # With the one column alone, DuckDB's reader takes ten times as long (2.0.1, measured).
        "SELECT DISTINCT observers FROM read_json(?, format = 'newline_delimited', "
        "columns = {'stage': 'VARCHAR', 'observers': 'VARCHAR[]'})",
        [[str(path) for path in sources]],
    ).fetchall()
    return sorted({name for (names,) in rows for name in names or () if name is not None})


def _struct(names: list[str]) -> str:
    if not names:
        return "MAP(VARCHAR, DOUBLE)"
    return "STRUCT(" + ", ".join(f"{quoted(name)} DOUBLE" for name in names) + ")"


def _summed(column: str, names: list[str]) -> str:
    if not names:
        return "0.0"
    return " + ".join(f"coalesce({column}.{quoted(name)}, 0.0)" for name in names)


def quoted(name: str) -> str:
    """``name`` as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _columns(columns: dict[str, str]) -> str:
    return "{" + ", ".join(f"'{name}': '{kind}'" for name, kind in columns.items()) + "}"
