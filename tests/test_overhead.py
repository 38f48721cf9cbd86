from __future__ import annotations

from pathlib import Path

import pytest

from verl_events import VerlEventsWarning
from verl_events.apps.overhead import overhead_table, read_timing_records
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
