"""``verl-events diagnose`` on a large run: the timing and memory logs read by their ends, the
weight-sync ledger by a byte search (verl_events/apps/read/large_logs.py).  The size past
which a log counts as large is lowered here, so that runs of this test's size take the path
a thousand-rank run takes; each answer is compared with ``--read-all``'s on the same run.
The failure is real: a stage that raised MemoryError inside an enclosing stage, with the
timing and memory observers writing their logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import verl_events
from verl_events.apps.cli import main
from verl_events.apps.read import large_logs
from verl_events.apps.read.record import Evidence, records_of
from verl_events.observers.weight_sync import record as weight_sync_record

STEPS = 40


def diagnosis(capsys: pytest.CaptureFixture[str], run: Path, *flags: str) -> dict[str, Any]:
    assert main(["diagnose", str(run), "--json", *flags]) == 1
    return json.loads(capsys.readouterr().out)


def run_out_of_memory_at_the_last_step(save_path: Path) -> None:
    observers = [{"name": "timing"}, {"name": "memory"}]
    with pytest.raises(MemoryError), verl_events.install({"save_path": str(save_path), "observers": observers}):
        for step in range(1, STEPS + 1):
            for stage in ("actor_compute_log_prob", "compute_values"):
                with verl_events.stage(stage, step=step):
                    pass
            with verl_events.stage("actor_update", step=step), verl_events.stage("train_batch", step=step):
                if step == STEPS:
                    raise MemoryError("the batch of step 40 does not fit")


def test_a_large_runs_logs_read_by_their_ends_name_the_same_failure_as_every_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_out_of_memory_at_the_last_step(tmp_path)
    every_line = diagnosis(capsys, tmp_path, "--read-all")
    monkeypatch.setattr(large_logs, "FULL_READ_BYTES", 0)
    monkeypatch.setattr(large_logs, "TAIL_BYTES", 4096)  # a few lines of each log: far from the whole
    timing_log = tmp_path / "timing" / "rank0.jsonl"
    assert timing_log.stat().st_size > 5 * 4096
    ends = diagnosis(capsys, tmp_path)
    assert ends["first"] == every_line["first"] and ends["cascade"] == every_line["cascade"]
    first = ends["first"]
    assert (first["step"], first["stage"], first["kind"]) == (STEPS, "train_batch", "oom")
    assert "the process held" in first["detail"]  # the memory record of the stage, read from the log's end
    (timing,) = [tool for tool in ends["tools"] if tool["tool"] == "timing"]
    (timing_all,) = [tool for tool in every_line["tools"] if tool["tool"] == "timing"]
    assert timing_all["summary"].startswith(f"{STEPS * 4} stage record(s) from 1 rank(s), 2 raised")
    assert "their ends read for the stages that raised, 2 raised" in timing["summary"]
    assert "diagnose --read-all" in timing["summary"] and ends["warnings"] == every_line["warnings"] == []
    assert every_line["read_in_part"] == []
    assert ends["read_in_part"] == ["timing logs: the last 4 KiB of each", "memory logs: the last 4 KiB of rank(s) 0"]


def sync(step: int, rank: int, alarms: list[Any]) -> str:
    return weight_sync_record.SyncRecord(
        run="r",
        step=step,
        rank=rank,
        time=1000.0 + step,
        complete=True,
        tensors=3,
        bytes=300,
        adapter=False,
        adapter_tensors=0,
        changed=3,
        unchanged=[],
        optimizer_stepped=True,
        nonfinite=[name for alarm in alarms for name in alarm.tensors],
        receipt=None,
        alarms=alarms,
    ).to_json()


def test_the_ledgers_alarms_found_by_a_byte_search_are_those_every_line_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nan = weight_sync_record.Alarm("nonfinite", ["w"], 1, "model.layers.1", "NaN in w")
    alarmed = {(1, 0), (7, 1), (8, 0), (50, 1)}  # the first line, two neighbours, the last line
    lines = [sync(step, rank, [nan] if (step, rank) in alarmed else []) for step in range(1, 51) for rank in (0, 1)]
    path = weight_sync_record.weight_sync_log_path(tmp_path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setattr(large_logs, "CHUNK_BYTES", 1000)  # lines cut across chunks
    evidence = Evidence(tmp_path, "r")
    every = [(n, r) for n, r in records_of(evidence, path, weight_sync_record.SyncRecord) if r.alarms]
    found = list(
        large_logs.lines_matching(evidence, path, large_logs.ALARM_LINE, weight_sync_record.SyncRecord.from_json)
    )
    assert found == every and {(r.step, r.rank) for _, r in found} == alarmed
    assert [n for n, _ in found] == [1, 14, 15, 100] and evidence.warnings == []
