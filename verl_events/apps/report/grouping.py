"""A run's timing records by (stage, step), in one pass: what the report's tables share.

Everything the tables need of a (stage, step) is gathered while the records are walked
in the order they were read.  Walking a million records a group at a time instead (all
ranks of one step, then the next) costs about 1.5 us a record per pass, three times the
whole pass here: the records lie in memory in read order, a rank's file at a time, and a
group takes one record of each, a cache miss each (measured on
benchmarks/report_scale.py's 1000 ranks; see docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..read.overhead import TimingRecord, profilers

__all__ = ["Key", "StepGroup", "index_records"]

Key = tuple[str, int | None]  # (stage, step)


@dataclass(slots=True)
class StepGroup:
    """One stage of one step over all ranks.  ``unprofiled`` and ``profiled``: each rank's
    seconds there (summed over its calls in the step), of its unprofiled and its profiled
    records apart; ``last``: each rank's last record; ``slowest``: the record of the
    longest body, ``fastest_s`` the shortest; ``profiled_by``: every name
    :func:`~.overhead.profilers` gives its profiled records; ``hooks_s``: the largest
    ``overhead_s``; ``dump_bytes``: summed."""

    slowest: TimingRecord
    fastest_s: float
    unprofiled: dict[int, float] = field(default_factory=dict)
    profiled: dict[int, float] = field(default_factory=dict)
    last: dict[int, TimingRecord] = field(default_factory=dict)
    profiled_by: set[str] = field(default_factory=set)
    hooks_s: float = 0.0
    dump_bytes: int = 0

    @property
    def ranks(self) -> int:
        return len(self.unprofiled.keys() | self.profiled.keys())


def index_records(records: Iterable[TimingRecord]) -> tuple[dict[Key, StepGroup], dict[str, list[float]]]:
    """The records' groups by (stage, step), in order of first appearance, and each
    stage's unprofiled body times, record by record (the baseline of its ratios)."""
    groups: dict[Key, StepGroup] = {}
    baseline: dict[str, list[float]] = {}
    for record in records:
        key = (record.stage, record.step)
        seconds = record.elapsed_s
        group = groups.get(key)
        if group is None:
            group = groups[key] = StepGroup(record, seconds)
        elif seconds > group.slowest.elapsed_s:
            group.slowest = record
        elif seconds < group.fastest_s:
            group.fastest_s = seconds
        rank = record.rank
        if record.profiled:
            cells = group.profiled
            group.profiled_by.update(profilers(record))
        else:
            cells = group.unprofiled
            times = baseline.get(key[0])
            if times is None:
                times = baseline[key[0]] = []
            times.append(seconds)
        if rank in cells:
            cells[rank] += seconds
        else:
            cells[rank] = seconds
        group.last[rank] = record
        if record.overhead_s > group.hooks_s:
            group.hooks_s = record.overhead_s
        group.dump_bytes += record.dump_bytes
    return groups, baseline
