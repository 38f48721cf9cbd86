"""The watchdog in one process: deadlines, reports, records, heartbeats, the hang signal, options."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import verl_events
from verl_events import ConfigError, HangEvent, hang
from verl_events.observers import WatchdogObserver
from verl_events.observers.watchdog import ABORT_EXIT_CODE, HangRecord, Heartbeat
from verl_events.observers.watchdog.record import (
    NotAHeartbeat,
    heartbeat_path,
    read_heartbeat,
    report_files,
    write_heartbeat,
)


def config(save_path: Path, **options: object) -> dict[str, object]:
    return {"save_path": str(save_path), "observers": [{"name": "watchdog", "heartbeat_s": 0.05, **options}]}


def records(save_path: Path) -> list[HangRecord]:
    log = save_path / "hangs.jsonl"
    return [HangRecord.from_json(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_stage_past_its_deadline_is_reported_with_its_line_then_recorded_late(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="verl_events.watchdog"),
        verl_events.install(config(tmp_path, timeout_s=0.2)),
    ):
        with verl_events.stage("actor_update", step=7):
            time.sleep(1.0)
    hung, late = records(tmp_path)
    assert (hung.kind, hung.step, hung.stage, hung.rank, hung.deadline, hung.deadline_s) == (
        "hang",
        7,
        "actor_update",
        0,
        "fixed",
        0.2,
    )
    assert 0.2 <= hung.elapsed_s <= 0.2 + 2
    assert hung.where is not None and hung.where["file"] == __file__ and hung.where["code"] == "time.sleep(1.0)"
    assert "not initialised" in str(hung.collective)
    assert late.kind == "late" and late.elapsed_s >= 1.0
    (report,) = report_files(tmp_path)
    assert report.name == "step_7_actor_update_rank0.txt" and hung.report == "hangs/" + report.name
    text = report.read_text()
    assert "step 7, stage actor_update" in text and f">> File {__file__!r}" in text
    assert "Thread MainThread (the stage's thread):" in text
    warnings = [r.getMessage() for r in caplog.records if r.name == "verl_events.watchdog"]
    assert len(warnings) == 2 and "past its deadline" in warnings[0] and "ended late" in warnings[1]


def test_the_hang_signal_carries_a_typed_event(tmp_path: Path) -> None:
    seen: list[HangEvent] = []

    def receiver(sender: str, *, event: HangEvent) -> None:
        seen.append(event)

    hang.connect(receiver)
    try:
        with verl_events.install(config(tmp_path, timeout_s=0.1)):
            with verl_events.stage("critic_update", step=2):
                time.sleep(0.6)
    finally:
        hang.disconnect(receiver)
    (event,) = seen
    assert (event.stage, event.step, event.rank, event.deadline_s) == ("critic_update", 2, 0, 0.1)
    assert event.where is not None and event.where.startswith(f"{__file__}:")
    assert event.report is not None and Path(event.report).is_file()


def test_stages_within_their_deadline_leave_no_record_and_a_current_heartbeat(tmp_path: Path) -> None:
    with verl_events.install(config(tmp_path, timeout_s=30)):
        for step in (1, 2):
            for name in ("actor_compute_log_prob", "actor_update"):
                with verl_events.stage(name, step=step):
                    pass
        with verl_events.stage("rollout_generate", step=3):
            time.sleep(0.3)  # the monitor rewrites the heartbeat meanwhile
            live = read_heartbeat(heartbeat_path(tmp_path, 0))
    assert records(tmp_path) == []
    assert [(o["stage"], o["step"]) for o in live.open] == [("rollout_generate", 3)]
    assert live.last_ended is not None and live.last_ended["stage"] == "actor_update" and not live.closed
    final = read_heartbeat(heartbeat_path(tmp_path, 0))
    assert final.closed and final.open == [] and final.begun == 5
    assert final.ended["actor_update"]["step"] == 2 and final.ended["rollout_generate"]["step"] == 3


def test_the_adaptive_deadline_is_a_multiple_of_the_longest_time_and_a_late_stage_does_not_raise_it(
    tmp_path: Path,
) -> None:
    with verl_events.install(config(tmp_path, multiple=4, floor_s=0.1, first_s=50)):
        with verl_events.stage("actor_update", step=1):
            time.sleep(0.05)  # the first time: first_s, 50 s
        for step in (2, 3):
            with verl_events.stage("actor_update", step=step):
                time.sleep(0.8)  # 4 x 0.05 s passed, both times: step 2's time taught nothing
    hung = [r for r in records(tmp_path) if r.kind == "hang"]
    assert [(r.step, r.deadline) for r in hung] == [(2, "adaptive"), (3, "adaptive")]
    assert all(4 * 0.05 <= r.deadline_s < 0.8 and r.deadline_s == hung[0].deadline_s for r in hung)


def test_the_floor_holds_for_fast_stages(tmp_path: Path) -> None:
    with verl_events.install(config(tmp_path, multiple=4, floor_s=0.5, first_s=50)):
        with verl_events.stage("actor_update", step=1):
            pass
        with verl_events.stage("actor_update", step=2):
            time.sleep(0.2)  # far more than 4 x the first time, less than the floor
    assert records(tmp_path) == []


def test_concurrent_stages_on_threads_each_get_their_deadline(tmp_path: Path) -> None:
    def slow() -> None:
        with verl_events.stage("compute_rm_score", step=1):
            time.sleep(0.8)

    with verl_events.install(config(tmp_path, timeout_s=0.2)):
        thread = threading.Thread(target=slow, name="reward")
        thread.start()
        with verl_events.stage("actor_update", step=1):
            pass
        thread.join()
    (hung, late) = records(tmp_path)
    assert hung.stage == "compute_rm_score" and hung.thread == "reward" and late.kind == "late"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout_s": 0}, r"option timeout_s: 0 is not allowed; use a number of seconds > 0, or null"),
        ({"timeout_s": -5}, r"option timeout_s: -5 is not allowed"),
        ({"timeout_s": "10"}, r"option timeout_s: '10' is not allowed; use a number"),
        ({"timeout_s": float("nan")}, r"option timeout_s: nan is not allowed; use a number of seconds > 0"),
        ({"action": "kill"}, r"option action: 'kill' is not allowed; use one of 'report', 'abort'"),
        ({"multiple": 0.5}, r"option multiple: 0.5 is not allowed; use a number >= 1"),
        ({"floor_s": 0}, r"option floor_s: 0 is not allowed; use a number of seconds > 0"),
    ],
)
def test_bad_options_are_refused_with_the_option_the_value_and_what_is_allowed(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=r"observers\[0\] \(watchdog\): " + message):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "watchdog", **options}]})


def test_a_watchdog_built_in_python_checks_its_options_too() -> None:
    with pytest.raises(ConfigError, match=r"action: 'kill' is not allowed; use 'report' or 'abort'"):
        WatchdogObserver(action="kill")  # type: ignore[arg-type]


def test_records_and_heartbeats_read_back_what_was_written() -> None:
    where = {"file": "x.py", "line": 3, "function": "f", "code": ""}
    record = HangRecord(
        kind="hang", run="r", time=2.0, step=3, stage="actor_update", rank=1, began=1.0, elapsed_s=1.0, deadline_s=0.5
    )
    record = HangRecord.from_json(record.to_json().replace('"where": null', f'"where": {json.dumps(where)}'))
    assert record.where == where
    assert HangRecord.from_json(record.to_json()) == record
    beat = Heartbeat(run="r", rank=1, time=5.0, open=[{"stage": "actor_update", "step": 3, "since": 1.0}])
    assert Heartbeat.from_json(beat.to_json()) == beat
    with pytest.raises(ValueError, match="lacks time"):
        HangRecord.from_json(json.dumps({"kind": "hang", "step": 1}))


def test_a_heartbeat_that_beats_by_mtime_is_alive_while_its_mtime_moves_and_silent_once_it_stops(
    tmp_path: Path,
) -> None:
    from verl_events.apps.read.liveness import Newest, liveness

    def peers_on_its_host(at: float) -> Newest:
        return Newest(at, {"another-node": at})

    path = heartbeat_path(tmp_path, 1)
    path.parent.mkdir()
    beat = Heartbeat(run="r", rank=1, pid=1, host="another-node", time=1000.0, liveness_s=2.0, mtime_beats=True)
    write_heartbeat(tmp_path, beat)
    os.utime(path, (1030.0, 1030.0))  # its liveness beats, the content unchanged since 1000
    assert read_heartbeat(path).time == 1030.0
    assert liveness(read_heartbeat(path), now=1031.0, newest=peers_on_its_host(1031.0)).state == "alive"
    # the others on its host beat on
    assert liveness(read_heartbeat(path), now=1040.0, newest=peers_on_its_host(1040.0)).state == "silent"
    # a heartbeat that does not beat by mtime (an earlier writer; a file written by hand) is read at its time
    write_heartbeat(tmp_path, replace(beat, mtime_beats=False))
    os.utime(path, (1030.0, 1030.0))
    assert read_heartbeat(path).time == 1000.0
    assert liveness(read_heartbeat(path), now=1031.0, newest=peers_on_its_host(1031.0)).state == "silent"
    # and a closed one is read at its last word
    write_heartbeat(tmp_path, replace(beat, closed=True))
    os.utime(path, (1030.0, 1030.0))
    assert read_heartbeat(path).time == 1000.0


@pytest.mark.slow
def test_action_abort_ends_the_process_with_the_documented_code(tmp_path: Path) -> None:
    script = tmp_path / "stuck.py"
    script.write_text(
        "import time, verl_events\n"
        f"config = {config(tmp_path / 'run', timeout_s=0.5, action='abort')!r}\n"
        "with verl_events.install(config):\n"
        "    with verl_events.stage('actor_update', step=1):\n"
        "        time.sleep(60)\n"
    )
    began = time.monotonic()
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == ABORT_EXIT_CODE, result.stderr
    assert time.monotonic() - began < 30
    (hung,) = records(tmp_path / "run")
    assert hung.action == "abort" and (tmp_path / "run" / hung.report).is_file()  # type: ignore[operator]
    assert f"exit code {ABORT_EXIT_CODE}" in result.stderr


def test_a_boundary_record_moves_a_heartbeat_only_where_both_are_the_watchdogs(tmp_path: Path) -> None:
    """The boundary record of the heartbeat's own process is newer: its position wins.  A
    heartbeat whose fields are not as the watchdog writes them (another writer, a damaged copy)
    is read as it is: the record is left aside, never a traceback."""
    from verl_events.observers.watchdog.boundary import BEGAN, BoundaryWriter, boundary_path

    path = heartbeat_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    writer = BoundaryWriter(boundary_path(path))
    writer.store(BEGAN, "actor_update", 2, 0, 5, time.time(), threading.get_ident())
    writer.close()
    beat = {"run": "r", "rank": 0, "pid": os.getpid(), "time": time.time() - 1.0, "begun": 4, "open": []}
    path.write_text(json.dumps(beat))
    read = read_heartbeat(path)
    assert read.from_boundary and [(o["stage"], o["step"]) for o in read.open] == [("actor_update", 2)]
    path.write_text(json.dumps(beat | {"last_begun": {"stage": "x", "time": "yesterday"}}))
    assert not read_heartbeat(path).from_boundary  # a position it cannot order is left aside
    # Fields of the wrong type make it no heartbeat: one sentence naming the field, never a traceback.
    for damaged, said in (
        ({"open": ["x"]}, "its open is ['x'], not a list, each an object"),
        ({"begun": "4"}, "its begun is '4'"),
    ):
        path.write_text(json.dumps(beat | damaged))
        with pytest.raises(NotAHeartbeat, match=re.escape(said)):
            read_heartbeat(path)
