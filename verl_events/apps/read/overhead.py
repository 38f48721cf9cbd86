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
from verl_events.layout import read_regular
from verl_events.observers import timing as timing_log

# The timing log's names, as its owner defines them.
TimingRecord = timing_log.TimingRecord
NotATimingRecord = timing_log.NotATimingRecord
timing_log_files = timing_log.timing_log_files

__all__ = [
    "IQR_MIN_N",
    "TRUSTED_MIN_N",
    "ObserverHooks",
    "StageOverhead",
    "TimingLogError",
    "AROUND",
    "TimingRecord",  # what read_timing_records returns, for the report's annotations
    "by_stage",
    "observer_hooks",
    "overhead_row",
    "overhead_table",
    "profiled_seconds",
    "profilers",
    "read_timing_records",
    "runs_in",
    "summary",
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
            try:
                _read_one(path, records, notes)
            except OSError as exc:  # a FIFO or a device where a log belongs, a log that vanished
                notes.append(f"{path} cannot be read: {exc}; skipped")
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
    lines = read_regular(path).split(b"\n")
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
    return tuple(record.profiled_by) + tuple(f"{name}{AROUND}" for name in record.enclosed_by)


def profiled_seconds(record: TimingRecord) -> float:
    """Body time plus the other observers' hook time: what the stage cost."""
    return float(record.elapsed_s) + float(record.overhead_s)


#: A median of fewer records than this is marked as not to be trusted: one
#: slow call (a warm-up, a page fault) moves it as far as it likes.
TRUSTED_MIN_N = 3
#: From this many records on, the spread is the interquartile range
#: (numpy's default interpolation); below it, the minimum and maximum.
IQR_MIN_N = 4


@dataclass(frozen=True, slots=True)
class StageOverhead:
    """One row of the overhead table: a stage, and the set of observers that
    profiled it (empty for a stage never profiled).  Times in seconds,
    medians over records of all ranks.  ``profiled_s`` is body plus observer hooks, ``hooks_s``
    the hooks alone (session start/stop; the rest of the cost is inside the
    body); ``ratio`` is profiled / unprofiled (None without both).

    Beside each median (``unprofiled_s``, ``profiled_s``): its ``_n``, its
    spread from ``_low_s`` to ``_high_s`` — the interquartile range when
    ``_spread`` is ``"iqr"`` (n >= :data:`IQR_MIN_N`), minimum to maximum
    when it is ``"min-max"``, all three None without records — and
    ``_too_few``, true when there is a median but of fewer than
    :data:`TRUSTED_MIN_N` records.  ``ratio_too_few``: either side of the
    ratio is.  ``profiled_first_s``: the median over ranks of each rank's
    first profiled call, which pays the tool's one-off costs (warm-up); it
    counts in the median like any other call."""

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
    unprofiled_low_s: float | None
    unprofiled_high_s: float | None
    unprofiled_spread: str | None
    unprofiled_too_few: bool
    profiled_low_s: float | None
    profiled_high_s: float | None
    profiled_spread: str | None
    profiled_too_few: bool
    profiled_first_s: float | None
    ratio_too_few: bool


@dataclass(frozen=True, slots=True)
class _Summary:
    """A median with its count and spread (see :class:`StageOverhead`)."""

    median: float | None
    n: int
    low: float | None
    high: float | None
    spread: str | None

    @property
    def too_few(self) -> bool:
        return self.median is not None and self.n < TRUSTED_MIN_N


def _summarise(values: list[float]) -> _Summary:
    """Median, count and spread of ``values``, which it sorts in place (empty: all None).

    Figures as ``statistics.median`` and ``statistics.quantiles(method="inclusive")``
    give them, computed here on the one sorted list: a stage of a million
    records is sorted once, not three times."""
    values.sort()
    n = len(values)
    if not n:
        return _Summary(None, 0, None, None, None)
    half = n // 2
    median = values[half] if n % 2 else (values[half - 1] + values[half]) / 2
    if n < IQR_MIN_N:
        return _Summary(median, n, values[0], values[-1], "min-max")
    low, high = (_inclusive_quantile(values, i) for i in (1, 3))
    return _Summary(median, n, low, high, "iqr")


def _inclusive_quantile(ordered: list[float], quarter: int) -> float:
    """The ``quarter``-th quartile of sorted ``ordered``, as statistics.quantiles's inclusive method."""
    j, delta = divmod(quarter * (len(ordered) - 1), 4)
    return (ordered[j] * (4 - delta) + ordered[j + 1] * delta) / 4 if delta else ordered[j]


#: How the overhead table names an observer that profiled a stage enclosing the row's.
AROUND = " (around)"


def by_stage(records: Iterable[TimingRecord], stage_order: Iterable[str] = ()) -> list[tuple[str, list[TimingRecord]]]:
    """``records`` grouped by stage, each group in file order: the stages of ``stage_order``
    first, in its order, then the others by name."""
    grouped: dict[str, list[TimingRecord]] = {}
    for record in records:
        grouped.setdefault(record.stage, []).append(record)
    order = list(stage_order)
    first = [(stage, grouped[stage]) for stage in order if stage in grouped]
    others = sorted(stage for stage in grouped if stage not in order)
    return first + [(stage, grouped[stage]) for stage in others]


def overhead_table(records: Iterable[TimingRecord], stage_order: Iterable[str] = ()) -> list[StageOverhead]:
    """Per stage and set of profiling observers: median unprofiled time of
    the stage, median profiled time, their ratio, and dump bytes (total,
    and per profiled step summed over ranks); each median with its count
    and spread."""
    rows = []
    for stage, mine in by_stage(records, stage_order):
        base = _summarise([float(r.elapsed_s) for r in mine if not r.profiled])
        groups: dict[tuple[str, ...], list[TimingRecord]] = {}
        for record in mine:
            if record.profiled:
                groups.setdefault(profilers(record), []).append(record)
        for profiled_by, profiled in sorted(groups.items()) or [((), [])]:
            rows.append(_row(stage, profiled_by, base, profiled))
    return rows


def _row(stage: str, profiled_by: tuple[str, ...], base: _Summary, profiled: list[TimingRecord]) -> StageOverhead:
    firsts: dict[int, TimingRecord] = {}
    for record in profiled:  # records are in file order: each rank's calls in the order they ran
        firsts.setdefault(record.rank, record)
    return overhead_row(
        stage,
        profiled_by,
        base,
        _summarise([profiled_seconds(r) for r in profiled]),
        statistics.median(float(r.overhead_s) for r in profiled) if profiled else None,
        sum(int(r.dump_bytes) for r in profiled),
        len({r.step for r in profiled}),
        statistics.median(profiled_seconds(r) for r in firsts.values()) if firsts else None,
    )


def summary(
    n: int, median: float | None, quartiles: tuple[float, float] | None, lowest: float | None, highest: float | None
) -> _Summary:
    """A median with its count and spread, from figures computed elsewhere (the columnar
    engine): the interquartile range from :data:`IQR_MIN_N` values on, else the extremes."""
    if not n:
        return _Summary(None, 0, None, None, None)
    if n < IQR_MIN_N or quartiles is None:
        return _Summary(median, n, lowest, highest, "min-max")
    return _Summary(median, n, quartiles[0], quartiles[1], "iqr")


def overhead_row(
    stage: str,
    profiled_by: tuple[str, ...],
    base: _Summary,
    cost: _Summary,
    hooks_s: float | None,
    dumped: int,
    steps: int,
    first_s: float | None,
) -> StageOverhead:
    """One row of the overhead table: ``base`` summarises the stage's unprofiled times,
    ``cost`` its profiled ones (body plus hooks) by ``profiled_by``; ``hooks_s``: their
    median hook time; ``dumped``: their dump bytes over ``steps`` steps; ``first_s``: the
    median over ranks of each rank's first profiled call."""
    ratio = cost.median / base.median if cost.median is not None and base.median else None
    return StageOverhead(
        stage=stage,
        profiled_by=profiled_by,
        unprofiled_s=base.median,
        unprofiled_n=base.n,
        profiled_s=cost.median,
        profiled_n=cost.n,
        hooks_s=hooks_s,
        ratio=ratio,
        dump_bytes=dumped,
        dump_bytes_per_step=dumped / steps if steps else 0.0,
        unprofiled_low_s=base.low,
        unprofiled_high_s=base.high,
        unprofiled_spread=base.spread,
        unprofiled_too_few=base.too_few,
        profiled_low_s=cost.low,
        profiled_high_s=cost.high,
        profiled_spread=cost.spread,
        profiled_too_few=cost.too_few,
        profiled_first_s=first_s,
        ratio_too_few=ratio is not None and (base.too_few or cost.too_few),
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
