from __future__ import annotations

from pathlib import Path

import pytest

from verl_events import VerlEventsWarning
from verl_events.apps.read.overhead import StageOverhead, overhead_table, read_timing_records
from verl_events.observers.timing import TimingRecord


def record(
    stage: str, step: int, elapsed: float, overhead: float = 0.0, dump: int = 0, rank: int = 0, by: str = "msprobe"
) -> TimingRecord:
    profiled = overhead > 0 or dump > 0
    return TimingRecord(
        stage=stage,
        step=step,
        rank=rank,
        elapsed_s=elapsed,
        overhead_s=overhead,
        profiled=profiled,
        profiled_by=(by,) if profiled else (),
        dump_bytes=dump,
    )


def test_overhead_is_profiled_cost_over_the_unprofiled_median() -> None:
    records = [
        record("actor_update", 1, 2.0, overhead=1.0, dump=300),
        record("actor_update", 1, 2.0, overhead=1.0, dump=300, rank=1),
        record("actor_update", 2, 1.0),
        record("actor_update", 3, 1.0),
        record("actor_update", 4, 5.0),
        record("rollout_generate", 1, 4.0),
    ]
    rollout, actor = overhead_table(records, ["rollout_generate", "actor_update"])
    assert (actor.unprofiled_s, actor.unprofiled_n) == (1.0, 3)
    assert (actor.profiled_s, actor.profiled_n, actor.hooks_s) == (3.0, 2, 1.0)
    assert actor.ratio == 3.0
    assert (actor.dump_bytes, actor.dump_bytes_per_step) == (600, 600.0)
    assert actor.profiled_by == ("msprobe",)
    assert rollout.profiled_s is None and rollout.ratio is None and rollout.profiled_by == ()


def test_each_set_of_profiling_observers_gets_its_own_row() -> None:
    records = [
        record("actor_update", 1, 1.0, overhead=1.0, by="msprobe"),
        record("actor_update", 2, 1.0, overhead=3.0, by="torch_profiler"),
        record("actor_update", 3, 1.0),
    ]
    rows = overhead_table(records)
    assert [(r.profiled_by, r.ratio) for r in rows] == [(("msprobe",), 2.0), (("torch_profiler",), 4.0)]


def test_records_are_read_from_every_rank_file(tmp_path: Path) -> None:
    (tmp_path / "timing").mkdir()
    for rank in (0, 1):
        (tmp_path / f"timing/rank{rank}.jsonl").write_text(record("actor_update", 1, 1.0, rank=rank).to_json() + "\n\n")
    assert read_timing_records(tmp_path) == [
        record("actor_update", 1, 1.0, rank=0),
        record("actor_update", 1, 1.0, rank=1),
    ]


def test_a_corrupt_line_inside_a_log_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "timing").mkdir()
    (tmp_path / "timing/rank0.jsonl").write_text('{"stage": "a"}\n{oops\n{"stage": "b"}\n')
    with pytest.raises(ValueError, match=r"rank0.jsonl:2 is not a JSON line .*; the file is damaged"):
        read_timing_records(tmp_path)


def test_a_cut_last_line_is_a_warning_when_no_list_collects_it(tmp_path: Path) -> None:
    (tmp_path / "timing").mkdir()
    (tmp_path / "timing/rank0.jsonl").write_text(
        '{"stage": "a", "step": 1, "rank": 0, "elapsed_s": 0.1, "profiled": false}\n{oops'
    )
    with pytest.warns(VerlEventsWarning, match=r"rank0.jsonl:2: the last line is cut short and was skipped"):
        assert [r.stage for r in read_timing_records(tmp_path)] == ["a"]


def test_each_median_carries_its_count_and_its_spread() -> None:
    records = [record("actor_update", step, seconds) for step, seconds in enumerate([1.0, 2.0, 3.0, 4.0, 9.0], 1)]
    records += [record("actor_update", 6, 5.0, overhead=1.0), record("actor_update", 7, 7.0, overhead=1.0)]
    [actor] = overhead_table(records)
    # Five unprofiled records: the interquartile range, numpy's default interpolation.
    assert (actor.unprofiled_s, actor.unprofiled_n) == (3.0, 5)
    assert (actor.unprofiled_spread, actor.unprofiled_low_s, actor.unprofiled_high_s) == ("iqr", 2.0, 4.0)
    # Two profiled ones: minimum to maximum, of body plus hooks.
    assert (actor.profiled_s, actor.profiled_n) == (7.0, 2)
    assert (actor.profiled_spread, actor.profiled_low_s, actor.profiled_high_s) == ("min-max", 6.0, 8.0)


def test_a_stage_without_records_of_a_kind_has_no_spread() -> None:
    [rollout] = overhead_table([record("rollout_generate", 1, 4.0)])
    assert (rollout.profiled_s, rollout.profiled_n, rollout.profiled_spread) == (None, 0, None)
    assert (rollout.profiled_low_s, rollout.profiled_high_s, rollout.profiled_first_s) == (None, None, None)
    assert not rollout.profiled_too_few and not rollout.ratio_too_few


def test_a_median_of_fewer_than_three_records_is_marked_as_too_few() -> None:
    def row(unprofiled: int, profiled: int) -> StageOverhead:
        plain = [record("actor_update", step, 1.0) for step in range(unprofiled)]
        dumped = [record("actor_update", 100 + step, 3.0, overhead=1.0) for step in range(profiled)]
        [only] = overhead_table(plain + dumped)
        return only

    assert [(r.unprofiled_too_few, r.profiled_too_few, r.ratio_too_few) for r in (row(2, 3), row(3, 2), row(3, 3))] == [
        (True, False, True),  # either side makes the ratio untrustworthy
        (False, True, True),
        (False, False, False),
    ]
    assert row(0, 1).profiled_too_few and not row(0, 1).unprofiled_too_few  # no median is not a median of too few


def test_the_first_profiled_call_of_each_rank_is_reported_beside_the_median() -> None:
    records = [
        record("actor_update", 1, 9.0, overhead=1.0, rank=0),  # warm-up
        record("actor_update", 1, 7.0, overhead=1.0, rank=1),  # warm-up
        record("actor_update", 2, 1.0, overhead=1.0, rank=0),
        record("actor_update", 2, 1.0, overhead=1.0, rank=1),
        record("actor_update", 3, 1.0, overhead=1.0, rank=0),
    ]
    [row] = overhead_table(records)
    assert (row.profiled_s, row.profiled_first_s) == (2.0, 9.0)  # the median over ranks of 10 and 8
