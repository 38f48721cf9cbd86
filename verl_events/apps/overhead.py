"""Overhead and disk figures recomputed from the timing observer's logs.

Everything here reads ``{save_path}/timing/rank*.jsonl`` and nothing else,
so it works on a copy of a run taken from a cluster.  Each line is parsed
into the writer's :class:`~verl_events.observers.timing.TimingRecord`.
"""

from __future__ import annotations

import gc
import statistics
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from verl_events import VerlEventsWarning

from .formats import timing_log

# The timing log's names, as its owner defines them.
TimingRecord = timing_log.TimingRecord
NotATimingRecord = timing_log.NotATimingRecord
timing_log_files = timing_log.timing_log_files

__all__ = [
    "ObserverHooks",
    "StageOverhead",
    "TimingLogError",
    "TimingRecord",  # what read_timing_records returns, for the report's annotations
    "observer_hooks",
    "overhead_table",
    "profiled_seconds",
    "profilers",
    "read_timing_records",
    "runs_in",
]


class TimingLogError(ValueError):
    """A timing log cannot be read; the message names the file and line."""


def read_timing_records(
    source: Path | Iterable[Path],
    advance: Callable[[], None] = lambda: None,
    skipped: list[str] | None = None,
) -> list[TimingRecord]:
    """Every stage record of a run (``source`` is its save_path) or of the
    given log files, in file order; ``advance`` is called after each file.

    What a writer can leave is read, not fatal: a last line cut short (a
    crash or a full disk mid-write) and lines that are not stage records
    (:class:`~verl_events.observers.timing.NotATimingRecord`) are skipped,
    each file's skips described by one sentence appended to ``skipped`` (or
    issued as a VerlEventsWarning when it is None).  A line that is not JSON
    in the middle of a file raises TimingLogError naming the file and line:
    that is damage, not a cut.
    """
    files = timing_log_files(source) if isinstance(source, Path) else list(source)
    records: list[TimingRecord] = []
    notes: list[str] = []
    # A million small records would trigger repeated full garbage collections
    # (more than half the read time); none of them is cyclic.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for path in files:
            _read_one(path, records, notes)
            advance()
    finally:
        if collecting:
            gc.enable()
    if skipped is not None:
        skipped.extend(notes)
    else:
        for note in notes:
            warnings.warn(note, VerlEventsWarning, stacklevel=2)
    return records


def _read_one(path: Path, records: list[TimingRecord], notes: list[str]) -> None:
    with path.open("rb") as handle:
        lines = handle.read().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    parse = TimingRecord.from_json
    append = records.append
    foreign = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            append(parse(line))
        except NotATimingRecord:
            foreign += 1
        except ValueError as exc:
            if number - 1 == last:
                notes.append(f"{path}:{number}: the last line is cut short and was skipped (the run stopped mid-write)")
                continue
            raise TimingLogError(f"{path}:{number} is not a JSON line ({exc}); the file is damaged") from exc
    if foreign:
        notes.append(f"{path}: {foreign} line(s) are not stage records of the timing observer and were skipped")


def runs_in(records: Iterable[TimingRecord]) -> list[str]:
    """The run ids the records name, in order of appearance (older logs name none)."""
    return list(dict.fromkeys(r.run for r in records if isinstance(r.run, str)))


def profilers(record: TimingRecord) -> tuple[str, ...]:
    """Who profiled a stage: the observers that received it, then those
    around it (``"msprobe (around)"``: a session of an enclosing stage)."""
    return tuple(record.profiled_by) + tuple(f"{name} (around)" for name in record.enclosed_by)


def profiled_seconds(record: TimingRecord) -> float:
    """Body time plus the other observers' hook time: what the stage cost."""
    return float(record.elapsed_s) + float(record.overhead_s)


@dataclass(frozen=True, slots=True)
class StageOverhead:
    """One row of the overhead table: a stage, and the set of observers that
    profiled it (empty for a stage never profiled).  Times in seconds,
    medians over records of all ranks.  ``profiled_s`` is body plus observer hooks, ``hooks_s``
    the hooks alone (session start/stop; the rest of the cost is inside the
    body); ``ratio`` is profiled / unprofiled (None without both)."""

    stage: str
    profiled_by: tuple[str, ...]
    unprofiled_s: float | None
    unprofiled_n: int
    profiled_s: float | None
    profiled_n: int
    hooks_s: float | None
    ratio: float | None
    dump_bytes: int
    dump_bytes_per_step: float


def overhead_table(records: Iterable[TimingRecord], stage_order: Iterable[str] = ()) -> list[StageOverhead]:
    """Per stage and set of profiling observers: median unprofiled time of
    the stage, median profiled time, their ratio, and dump bytes (total,
    and per profiled step summed over ranks)."""
    by_stage: dict[str, list[TimingRecord]] = {}
    for record in records:
        by_stage.setdefault(record.stage, []).append(record)
    order = [s for s in stage_order if s in by_stage] + sorted(set(by_stage) - set(stage_order))
    rows = []
    for stage in order:
        plain = [float(r.elapsed_s) for r in by_stage[stage] if not r.profiled]
        base = statistics.median(plain) if plain else None
        groups: dict[tuple[str, ...], list[TimingRecord]] = {}
        for record in by_stage[stage]:
            if record.profiled:
                groups.setdefault(profilers(record), []).append(record)
        for profiled_by, profiled in sorted(groups.items()) or [((), [])]:
            rows.append(_row(stage, profiled_by, base, len(plain), profiled))
    return rows


def _row(
    stage: str, profiled_by: tuple[str, ...], base: float | None, base_n: int, profiled: list[TimingRecord]
) -> StageOverhead:
    cost = statistics.median(profiled_seconds(r) for r in profiled) if profiled else None
    dumped = sum(int(r.dump_bytes) for r in profiled)
    steps = {r.step for r in profiled}
    return StageOverhead(
        stage=stage,
        profiled_by=profiled_by,
        unprofiled_s=base,
        unprofiled_n=base_n,
        profiled_s=cost,
        profiled_n=len(profiled),
        hooks_s=statistics.median(float(r.overhead_s) for r in profiled) if profiled else None,
        ratio=cost / base if cost is not None and base else None,
        dump_bytes=dumped,
        dump_bytes_per_step=dumped / len(steps) if steps else 0.0,
    )


@dataclass(frozen=True, slots=True)
class ObserverHooks:
    """One observer's own cost on one stage: its begin plus end hook time,
    median and maximum over the records (all ranks and steps) it received."""

    observer: str
    stage: str
    median_s: float
    max_s: float
    n: int


def observer_hooks(records: Iterable[TimingRecord], stage_order: Iterable[str] = ()) -> list[ObserverHooks]:
    """Per observer and stage, that observer's hook time (from ``hook_s``)."""
    times: dict[tuple[str, str], list[float]] = {}
    for record in records:
        for name, seconds in record.hook_s.items():
            times.setdefault((name, record.stage), []).append(float(seconds))
    order = {stage: index for index, stage in enumerate(stage_order)}
    keys = sorted(times, key=lambda k: (k[0], order.get(k[1], len(order)), k[1]))
    return [
        ObserverHooks(
            name, stage, statistics.median(times[(name, stage)]), max(times[(name, stage)]), len(times[(name, stage)])
        )
        for name, stage in keys
    ]
