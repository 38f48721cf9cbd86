"""TimingObserver: per-rank JSON lines with times, hook overheads and dump bytes."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

import verl_events
from verl_events import Observer, StageEvent, stage
from verl_events.observers.timing import NotATimingRecord, TimingRecord, rank_bytes

from .support import Small, run_model


class SlowBegin(Observer):
    def on_stage_begin(self, event: StageEvent) -> None:
        time.sleep(0.01)


def read_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_line_per_stage_with_times_hooks_and_active_observers(tmp_path: Path) -> None:
    config = {
        "save_path": str(tmp_path),
        "observers": [
            {"name": "timing"},
            {"_target_": "tests.observers.test_timing:SlowBegin", "steps": [2]},
        ],
    }
    whole = []  # each stage's time as the caller sees it: its body and every hook
    with verl_events.install(config):
        for step in (1, 2):
            began = time.perf_counter()
            with stage("critic_update", step=step, batch=4):
                time.sleep(0.005)
            whole.append(time.perf_counter() - began)
    first, second = read_lines(tmp_path / "timing/rank0.jsonl")
    assert (first["stage"], first["role"], first["step"], first["rank"], first["world_size"]) == (
        "critic_update",
        "critic",
        1,
        0,
        1,
    )
    assert first["observers"] == ["timing"] and first["profiled"] is False and first["overhead_s"] == 0
    assert second["observers"] == ["timing", "tests.observers.test_timing:SlowBegin"] and second["profiled"] is True
    hook_s = second["hook_s"]
    assert isinstance(hook_s, dict) and hook_s["tests.observers.test_timing:SlowBegin"] >= 0.01
    assert second["overhead_s"] == hook_s["tests.observers.test_timing:SlowBegin"]
    # The body alone: at least its sleep, and the hook's time is not in it (both fit in the
    # caller's time only as two separate parts), however busy the machine is.
    elapsed = float(second["elapsed_s"])  # type: ignore[arg-type]
    assert 0.005 <= elapsed and elapsed + hook_s["tests.observers.test_timing:SlowBegin"] <= whole[1]
    assert second["error"] is None and "timestamp" in second


def test_errors_are_recorded_by_type(tmp_path: Path) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "timing"}]}):
        with pytest.raises(KeyError):
            with stage("actor_update", step=1):
                raise KeyError("x")
    [line] = read_lines(tmp_path / "timing/rank0.jsonl")
    assert line["error"] == "KeyError"


@pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")
def test_dump_bytes_match_the_msprobe_files_of_the_stage(tmp_path: Path, model: Small) -> None:
    config = {"save_path": str(tmp_path / "out"), "observers": [{"name": "timing"}, {"name": "msprobe", "steps": [1]}]}
    with verl_events.install(config):
        for step in (1, 2):
            with stage("actor_update", step=step, model=model):
                run_model(model)
    dumped, plain = read_lines(tmp_path / "out/timing/rank0.jsonl")
    files = (tmp_path / "out/step_1/actor_update/step0/rank0").iterdir()
    assert dumped["dump_bytes"] == sum(f.stat().st_size for f in files) > 0
    assert dumped["observers"] == ["timing", "msprobe"] and float(dumped["hook_s"]["msprobe"]) > 0  # type: ignore[index]
    assert plain["dump_bytes"] == 0 and plain["profiled"] is False


def test_rank_bytes_counts_only_that_ranks_files(tmp_path: Path) -> None:
    for name, size in [
        ("step0/rank0/dump.json", 10),
        ("step0/rank1/dump.json", 100),
        ("step0/rank10/dump.json", 1000),
        ("trace_rank0.json", 7),
        ("trace_rank01.json", 10000),
        ("prank0.txt", 5),
    ]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    assert rank_bytes(tmp_path, 0) == 17
    assert rank_bytes(tmp_path, 1) == 100
    assert rank_bytes(tmp_path / "missing", 0) == 0


def test_console_lines_are_optional(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "timing", "console": True}]}):
        with stage("compute_values", step=3):
            pass
    err = capsys.readouterr().err
    assert "event='stage' stage='compute_values' step=3 rank=0" in err and "observers='-'" in err


def test_each_rank_writes_its_own_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "timing"}]}):
        for rank in ("0", "3"):
            monkeypatch.setenv("RANK", rank)
            with stage("compute_values", step=1):
                pass
    assert sorted(p.name for p in (tmp_path / "timing").iterdir()) == ["rank0.jsonl", "rank3.jsonl"]
    assert read_lines(tmp_path / "timing/rank3.jsonl")[0]["rank"] == 3


def test_a_stage_nested_in_a_profiled_one_is_not_an_unprofiled_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl's train_batch runs inside actor_update: when a tool holds actor_update,
    train_batch runs under it too, and must not count as an unprofiled run."""
    from verl_events.apps.cli import main

    config = {
        "save_path": str(tmp_path),
        "observers": [
            {"name": "timing"},
            {"_target_": "tests.observers.test_timing:SlowBegin", "steps": [1], "stages": ["actor_update"]},
        ],
    }
    with verl_events.install(config):
        for step in (1, 2):
            with stage("actor_update", step=step), stage("train_batch", step=step):
                pass
    lines = {(r["stage"], r["step"]): r for r in read_lines(tmp_path / "timing/rank0.jsonl")}
    inner, inner_plain = lines[("train_batch", 1)], lines[("train_batch", 2)]
    slow = "tests.observers.test_timing:SlowBegin"
    assert (inner["profiled"], inner["profiled_by"], inner["enclosed_by"]) == (True, [], [slow])
    assert (inner_plain["profiled"], inner_plain["enclosed_by"]) == (False, [])
    assert lines[("actor_update", 1)]["enclosed_by"] == []
    assert main(["report", str(tmp_path), "--json"]) == 0
    overhead = {
        (row["stage"], tuple(row["profiled_by"])): row for row in json.loads(capsys.readouterr().out)["overhead"]
    }
    train_batch = overhead[("train_batch", (f"{slow} (around)",))]
    assert (train_batch["unprofiled_n"], train_batch["profiled_n"]) == (1, 1)


def test_a_timing_log_of_another_run_is_refused_and_records_name_their_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {"save_path": str(tmp_path), "observers": [{"name": "timing"}]}
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "first")
    with verl_events.install(config):
        with stage("critic_update", step=1):
            pass
    assert [line["run"] for line in read_lines(tmp_path / "timing/rank0.jsonl")] == ["first"]
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "second")
    with pytest.raises(
        verl_events.ConfigError,
        match=r"already holds 1 timing log\(s\) from another run \(run 'first'; this is run 'second'\)",
    ):
        verl_events.install(config)
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "first")  # a process joining run "first" appends
    with verl_events.install(config):
        with stage("critic_update", step=2):
            pass
    assert [line["step"] for line in read_lines(tmp_path / "timing/rank0.jsonl")] == [1, 2]


def test_a_run_started_beside_another_on_one_save_path_writes_no_timing_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Both installed before either wrote: the second to write is refused at its first record."""
    config = {"save_path": str(tmp_path), "observers": [{"name": "timing"}]}
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "late")
    late = verl_events.install(config)
    log = tmp_path / "timing/rank0.jsonl"
    log.write_text(
        json.dumps(
            {"run": "early", "stage": "critic_update", "step": 1, "rank": 0, "elapsed_s": 0.1, "profiled": False}
        )
        + "\n"
    )
    (tmp_path / "run.json").write_text('{"run_id": "early"}')
    with late:
        with stage("critic_update", step=1):
            pass
    assert [line["run"] for line in read_lines(log)] == ["early"]
    assert "from another run (run 'early'; this is run 'late')" in caplog.text


class Clock(Observer):
    passive = True

    def on_stage_begin(self, event: StageEvent) -> None:
        time.sleep(0.001)


def test_a_passive_observer_does_not_make_a_stage_profiled(tmp_path: Path) -> None:
    config = {
        "save_path": str(tmp_path),
        "observers": [{"name": "timing"}, {"_target_": "tests.observers.test_timing:Clock"}],
    }
    with verl_events.install(config):
        with stage("actor_update", step=1), stage("train_batch", step=1):
            pass
    lines = read_lines(tmp_path / "timing/rank0.jsonl")
    assert [(r["stage"], r["profiled"], r["profiled_by"], r["enclosed_by"]) for r in lines] == [
        ("train_batch", False, [], []),
        ("actor_update", False, [], []),
    ]
    assert all(r["hook_s"]["tests.observers.test_timing:Clock"] > 0 for r in lines)  # its cost is still measured


def test_a_written_line_holds_every_field_and_reads_back_as_its_record(tmp_path: Path) -> None:
    config = {
        "save_path": str(tmp_path),
        "observers": [{"name": "timing"}, {"_target_": "tests.observers.test_timing:SlowBegin"}],
    }
    with verl_events.install(config):
        with stage("actor_update", step=2):
            pass
    [line] = (tmp_path / "timing/rank0.jsonl").read_text().splitlines()
    assert list(json.loads(line)) == [f.name for f in dataclasses.fields(TimingRecord)]
    record = TimingRecord.from_json(line)
    assert (record.stage, record.step, record.profiled, record.profiled_by) == (
        "actor_update",
        2,
        True,
        ("tests.observers.test_timing:SlowBegin",),
    )
    assert record.observers == ("timing", "tests.observers.test_timing:SlowBegin") and record.event == "stage"
    assert record.end_unix is not None and record.timestamp is not None and record.timestamp.endswith("Z")
    assert TimingRecord.from_json(record.to_json()) == record and TimingRecord.from_json(line.encode()) == record
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.stage = "other"  # type: ignore[misc]


def test_a_line_of_an_older_writer_reads_with_the_defaults_and_ignores_unknown_keys() -> None:
    line = (
        '{"stage": "actor_update", "step": 1, "rank": 3, "elapsed_s": 0.5, '
        '"profiled": true, "profiled_by": ["msprobe"], "extra": 1}'
    )
    assert TimingRecord.from_json(line) == TimingRecord(
        stage="actor_update", step=1, rank=3, elapsed_s=0.5, profiled=True, profiled_by=("msprobe",)
    )
    old = TimingRecord.from_json(line)
    assert (old.run, old.observers, old.overhead_s, old.dump_bytes, dict(old.hook_s), old.end_unix) == (
        None,
        None,
        0.0,
        0,
        {},
        None,
    )
    # Python's json, which older writers used, writes a bare NaN: it parses, and a NaN is no duration.
    with pytest.raises(NotATimingRecord, match=r"its elapsed_s is nan, not a number of seconds"):
        TimingRecord.from_json('{"stage": "a", "step": null, "rank": 0, "elapsed_s": NaN, "profiled": false}')


def test_json_that_is_not_a_stage_record_is_refused_saying_what_it_lacks() -> None:
    with pytest.raises(
        NotATimingRecord,
        match=r"needs the keys stage, step, rank, elapsed_s, profiled; this one lacks step, elapsed_s: \{",
    ):
        TimingRecord.from_json('{"stage": "a", "rank": 0, "profiled": false}')
    with pytest.raises(NotATimingRecord, match=r"a timing line is a JSON object; this one is list: \[1, 2\]"):
        TimingRecord.from_json("[1, 2]")
    with pytest.raises(ValueError) as cut:
        TimingRecord.from_json('{"stage": "act')
    assert not isinstance(cut.value, NotATimingRecord)  # readers tell a cut line from another writer's
