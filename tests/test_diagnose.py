"""``verl-events diagnose`` in this process: runs without the watchdog, an anomalous run, a stage
past its deadline, and bad input (not a folder, nothing of ours, a heartbeat cut short, another
run's crash file).  The failures are real stages that raised; the two-rank deaths are in
tests/test_postmortem.py."""

from __future__ import annotations

import json
import math
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import verl_events
from verl_events.apps.cli import main
from verl_events.observers.watchdog.record import heartbeat_path


def diagnose(capsys: pytest.CaptureFixture[str], run: Path, *flags: str) -> tuple[int, str, str]:
    code = main(["diagnose", str(run), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def as_json(capsys: pytest.CaptureFixture[str], run: Path) -> tuple[int, dict[str, Any], str]:
    code, out, err = diagnose(capsys, run, "--json")
    return code, json.loads(out), err


def one_raising_step(save_path: Path, observers: list[dict[str, Any]], message: str = "bad batch") -> None:
    with pytest.raises(RuntimeError), verl_events.install({"save_path": str(save_path), "observers": observers}):
        with verl_events.stage("actor_compute_log_prob", step=1):
            pass
        with verl_events.stage("actor_update", step=1):
            raise RuntimeError(message)


def test_a_run_with_only_the_timing_observer_names_the_stage_and_says_what_it_could_not_see(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_raising_step(tmp_path, [{"name": "timing"}])
    code, result, _ = as_json(capsys, tmp_path)
    assert code == 1 and result["verdict"] == "failed"
    first = result["first"]
    assert (first["rank"], first["step"], first["stage"], first["kind"]) == (0, 1, "actor_update", "exception")
    assert first["detail"] == "RuntimeError: bad batch" and first["where"] is None  # the line is the watchdog's
    assert first["source"] == "timing/rank0.jsonl"
    (unseen,) = result["unseen"]
    assert unseen.startswith("no watchdog") and "- name: watchdog" in unseen
    assert [t["command"] for t in result["tools"]] == [f"verl-events report {tmp_path}"]
    code, text, _ = diagnose(capsys, tmp_path)
    assert "verdict: failed" in text and "not seen: no watchdog" in text


def test_with_the_watchdog_the_same_failure_is_read_once_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_raising_step(tmp_path, [{"name": "watchdog"}, {"name": "timing"}])
    code, result, _ = as_json(capsys, tmp_path)
    assert code == 1 and result["cascade"] == []  # the timing log's copy of the error is not a second failure
    first = result["first"]
    assert first["source"] == "crashes/rank0.jsonl" and first["where"]["file"] == __file__
    assert first["where"]["code"] == "raise RuntimeError(message)"


def test_an_anomaly_makes_the_run_anomalous_and_points_at_triage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {"save_path": str(tmp_path), "observers": [{"name": "sentinel"}, {"name": "watchdog"}]}
    with verl_events.install(config):
        for step in (1, 2):
            update = verl_events.stage("actor_update", step=step)
            with update:
                update.set_result({"actor/pg_loss": math.nan if step == 2 else 0.3})
    code, result, _ = as_json(capsys, tmp_path)
    assert code == 1 and result["verdict"] == "anomalous"
    assert (result["first"]["kind"], result["first"]["step"]) == ("anomaly", 2)
    assert any(t["tool"] == "sentinel" and t["command"].startswith("verl-events triage") for t in result["tools"])


def test_a_stage_past_its_deadline_that_has_not_ended_makes_the_run_hung(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {"save_path": str(tmp_path), "observers": [{"name": "watchdog", "timeout_s": 0.2, "heartbeat_s": 0.05}]}
    release = threading.Event()

    def stuck() -> None:
        with verl_events.stage("actor_update", step=4):
            release.wait(30)

    with verl_events.install(config):
        worker = threading.Thread(target=stuck)
        worker.start()
        try:
            deadline = time.monotonic() + 20
            while not (tmp_path / "hangs.jsonl").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            code, result, _ = as_json(capsys, tmp_path)  # while it is stuck
        finally:
            release.set()
            worker.join()
    assert code == 1 and result["verdict"] == "hung"
    first = result["first"]
    assert (first["kind"], first["step"], first["stage"]) == ("hang", 4, "actor_update")


def test_a_stage_that_ended_after_its_deadline_is_a_slow_stage_not_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The watchdog reports it when the deadline passes and adds a ``late`` line when it ends:
    it held nothing up for good, so the run is anomalous, not hung."""
    config = {"save_path": str(tmp_path), "observers": [{"name": "watchdog", "timeout_s": 0.2, "heartbeat_s": 0.05}]}
    with verl_events.install(config):
        with verl_events.stage("actor_update", step=4):
            time.sleep(0.8)
    code, result, _ = as_json(capsys, tmp_path)
    assert code == 1 and result["verdict"] == "anomalous" and result["cascade"] == []
    first = result["first"]
    assert (first["kind"], first["step"], first["stage"]) == ("slow", 4, "actor_update")
    assert first["detail"].startswith("passed its deadline of 0.2 s (fixed), then ended after 0.")
    assert first["where"]["code"] == "time.sleep(0.8)"


def test_a_healthy_run_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "watchdog"}, {"name": "timing"}]}):
        with verl_events.stage("actor_update", step=1):
            pass
    code, out, err = diagnose(capsys, tmp_path)
    assert code == 0 and out.splitlines()[1] == "verdict: healthy" and err == ""


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path, words in (
        (tmp_path / "nowhere", "does not exist"),
        (Path(__file__), "is not a directory"),
        (tmp_path, "holds nothing an observer writes"),
    ):
        code, out, err = diagnose(capsys, path)
        assert code == 2 and out == "" and err.count("\n") == 1 and words in err and str(path) in err


def test_a_heartbeat_cut_short_is_skipped_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "watchdog"}]}):
        with verl_events.stage("actor_update", step=1), verl_events.stage("train_batch", step=1, rank=1):
            pass
    cut = heartbeat_path(tmp_path, 1)
    cut.write_text(cut.read_text()[:30])  # as a full disk leaves it
    code, out, err = diagnose(capsys, tmp_path)
    assert code == 0 and "verdict: healthy" in out
    assert err == f"warning: {cut} was skipped: it is not JSON" + err.split("it is not JSON", 1)[1]
    assert "cut short" in err


def test_a_crash_record_of_another_run_is_skipped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "the-earlier-run")
    one_raising_step(tmp_path / "earlier", [{"name": "watchdog"}])
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "this-run")
    with verl_events.install({"save_path": str(tmp_path / "this"), "observers": [{"name": "watchdog"}]}):
        with verl_events.stage("actor_update", step=1):
            pass
    shutil.copy(tmp_path / "earlier/crashes/rank0.jsonl", tmp_path / "this/crashes/rank0.jsonl")
    code, result, err = as_json(capsys, tmp_path / "this")
    assert code == 0 and result["verdict"] == "healthy"
    assert "rank0.jsonl:1 was skipped: it belongs to run 'the-earlier-run', and this folder to run 'this-run'" in err


def test_a_rank_is_judged_by_its_own_hosts_clock_and_other_clocks_only_with_a_minute_of_skew_allowed() -> None:
    """The rule alone (a live rank on a host whose clock is 30 s behind is shown for real in
    tests/test_hangs.py)."""
    from verl_events.apps.read.liveness import SKEW_S, Newest, liveness
    from verl_events.observers.watchdog.record import Heartbeat

    far = Heartbeat(run="r", rank=1, pid=1, host="node-b", time=1000.0, liveness_s=2.0)
    assert liveness(far, now=1003.0, newest=Newest(1003.0, {"node-b": 1000.0})).state == "alive"
    # 10 s behind a rank of its own host, whose clock it shares: it stopped
    assert liveness(far, now=1003.0, newest=Newest(1010.0, {"node-b": 1010.0})).state == "silent"
    # 30 s behind a rank of another host, whose clock may run ahead: not enough to tell
    assert liveness(far, now=1003.0, newest=Newest(1030.0, {"node-a": 1030.0, "node-b": 1000.0})).state == "alive"
    # ... and a reader whose clock is 30 s ahead does not call it silent either
    assert liveness(far, now=1033.0, newest=Newest(1003.0, {"node-b": 1000.0})).state == "alive"
    # a whole host that stopped is silent once the others (or the reader) are a minute and three beats past it
    later = 1000.0 + SKEW_S + 10
    assert liveness(far, now=later, newest=Newest(later, {"node-a": later, "node-b": 1000.0})).state == "silent"
    assert liveness(far, now=later, newest=Newest(1000.0, {"node-b": 1000.0})).state == "silent"


# -- the order rules alone (the deaths themselves are real in tests/test_postmortem.py) ----------


def failure(kind: str, rank: int, time: float, detail: str, window: float = 0.0) -> Any:
    from verl_events.apps.read.record import Failure

    return Failure(kind, rank, time, detail, step=2, stage="actor_update", window=window)


def test_a_launchers_sigterm_after_errors_that_all_name_a_peer_is_never_first() -> None:
    from verl_events.apps.diagnose.verdict import judge

    nccl = failure("exception", 1, 100.0, "RuntimeError: NCCL error: unhandled cuda error")
    closed = failure("exception", 0, 101.0, "RuntimeError: Connection closed by peer")
    stopped = failure("signal", 0, 103.0, "SIGTERM")
    driver = failure("exception", -1, 104.0, "RayTaskError(RuntimeError): ray::TaskRunner.run()")
    verdict = judge([stopped, closed, driver, nccl])
    assert verdict.first is nccl
    whys = {f.rank: why for f, why in verdict.cascade if f.kind == "signal" or f.rank < 0}
    assert "launcher" in whys[0] and "driver" in whys[-1]


def test_an_error_within_a_killed_ranks_last_beat_window_is_preferred_and_the_order_called_unclear() -> None:
    from verl_events.apps.diagnose.verdict import judge

    killed = failure("killed", 1, 100.0, "stopped beating", window=2.0)
    raised = failure("exception", 0, 101.5, "ValueError: advantages are NaN")
    verdict = judge([killed, raised])
    assert verdict.first is raised
    ((other, why),) = verdict.cascade
    assert other is killed and "which came first cannot be told" in why
    later = failure("exception", 0, 103.0, "ValueError: advantages are NaN")
    assert judge([killed, later]).first is killed  # after the window: the death came first


def test_a_killed_driver_whose_task_raised_a_dead_actors_error_died_after_that_actor(tmp_path: Path) -> None:
    """The order CI once met on verl's trainer: the driver's last beat (Ray ends it at the job's
    end) was older than the killed rank's stage-boundary record, and its task's ActorDiedError,
    which main_ppo recorded, is the evidence that decides."""
    from dataclasses import replace

    from verl_events.apps.diagnose.verdict import judge
    from verl_events.apps.read.deaths import outlived
    from verl_events.apps.read.record import Evidence

    driver = replace(failure("killed", -1, 100.0, "stopped beating", window=2.0), pid=15182, in_stage=False)
    rank = replace(failure("killed", 1, 100.1, "stopped beating", window=2.0), pid=15364)
    said = "RayTaskError(ActorDiedError): ray::TaskRunnerV1.run() (pid=15182, ip=192.0.2.2, actor_id=bb14)"
    main_ppo = replace(failure("exception", -2, 101.2, said), pid=14924, source="crashes/ends.jsonl")
    evidence = Evidence(tmp_path, None, failures=[driver, rank, main_ppo])
    assert judge(evidence.failures).first is driver  # by time alone, the driver seems first
    outlived(evidence)
    verdict = judge(evidence.failures)
    assert verdict.first is rank
    ((ended, why),) = [(f, why) for f, why in verdict.cascade if f.rank == -1]
    assert ended.time == rank.time and "alive to raise a dead actor's error (crashes/ends.jsonl)" in why
    assert "rank 1's death" in why and "ActorDiedError" in ended.detail
    # A task that raised an error of its own says nothing about another death.
    own = replace(main_ppo, detail="RayTaskError(ValueError): ray::TaskRunnerV1.run() (pid=15182, ip=1)")
    evidence = Evidence(tmp_path, None, failures=[driver, rank, own])
    outlived(evidence)
    assert evidence.failures[0] is driver


def test_a_killed_driver_whose_task_passed_on_a_ranks_exception_died_after_it(tmp_path: Path) -> None:
    """The order CI met on verl's trainer: rank 0 raised; the driver's last beat was 0.1 s older;
    main_ppo's RayTaskError(RuntimeError) names the driver's pid, so it was alive to pass it on."""
    from dataclasses import replace

    from verl_events.apps.diagnose.verdict import judge
    from verl_events.apps.read.deaths import outlived
    from verl_events.apps.read.record import Evidence

    driver = replace(failure("killed", -1, 100.0, "stopped beating", window=2.0), pid=5972, in_stage=False)
    rank = replace(failure("exception", 0, 100.1, "RuntimeError: the actor's forward raised"), pid=6153)
    said = "RayTaskError(RuntimeError): ray::TaskRunnerV1.run() (pid=5972, ip=192.0.2.2, actor_id=09b3)"
    main_ppo = replace(failure("exception", -2, 101.1, said), pid=5713, source="crashes/ends.jsonl")
    evidence = Evidence(tmp_path, None, failures=[driver, rank, main_ppo])
    outlived(evidence)
    verdict = judge(evidence.failures)
    assert verdict.first is rank
    ((ended, why),) = [(f, why) for f, why in verdict.cascade if f.rank == -1]
    assert ended.time == rank.time and "after rank 0's exception" in why
    assert "alive to raise another process's RuntimeError (crashes/ends.jsonl)" in why
    # An exception of another type, or one the driver raised itself, decides nothing.
    other = replace(rank, detail="ValueError: advantages are NaN")
    evidence = Evidence(tmp_path, None, failures=[driver, other, main_ppo])
    outlived(evidence)
    assert evidence.failures[0] is driver
    itself = replace(rank, pid=5972, rank=-1)
    evidence = Evidence(tmp_path, None, failures=[driver, rank, itself, main_ppo])
    outlived(evidence)
    assert evidence.failures[0] is driver


def test_a_signal_the_process_lived_through_is_no_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A handler that saves a checkpoint and carries on: the process's last word is a normal end."""
    import os
    import signal

    previous = signal.signal(signal.SIGTERM, lambda number, frame: None)
    try:
        with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "watchdog"}]}):
            with verl_events.stage("actor_update", step=1):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
            with verl_events.stage("actor_update", step=2):
                pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (tmp_path / "crashes/rank0.jsonl").exists()  # the signal was recorded ...
    code, result, _ = as_json(capsys, tmp_path)
    assert code == 0 and result["verdict"] == "healthy"  # ... and lived through


def test_a_run_whose_ranks_still_beat_is_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "watchdog", "heartbeat_s": 0.05}]}):
        with verl_events.stage("actor_update", step=1):
            time.sleep(0.2)  # its heartbeat is on disk, open
            code, result, _ = as_json(capsys, tmp_path)
    assert code == 0 and result["verdict"] == "running" and result["first"] is None
    code, result, _ = as_json(capsys, tmp_path)
    assert code == 0 and result["verdict"] == "healthy"  # closed now


def test_a_thousand_ranks_cascade_fits_on_one_screen_with_the_anomaly_before_the_first_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1,024 ranks (one process plays them all, each with its own records): at step 3 rank 7's
    loss goes NaN, at step 4 its update raises, and the other 1,023 ranks' all-reduce raises
    "Connection closed by peer" after it.  The text folds the 1,023 alike into one line and
    names the NaN beside the first failure; --json keeps every item."""
    ranks = 1024
    config = {"save_path": str(tmp_path), "observers": [{"name": "sentinel"}, {"name": "watchdog"}]}
    with verl_events.install(config):
        for step in (1, 2, 3, 4):
            # Rank 7 first at step 4: its peers' collective fails after it.
            for rank in sorted(range(ranks), key=lambda r: (step == 4 and r != 7, r)):
                update = verl_events.stage("actor_update", step=step, rank=rank)
                try:
                    with update:
                        update.set_result({"actor/pg_loss": math.nan if (step, rank) == (3, 7) else 0.3})
                        if step == 4 and rank == 7:
                            raise RuntimeError("CUDA error: an illegal memory access was encountered")
                        if step == 4:
                            raise RuntimeError(f"[gloo] Connection closed by peer [10.0.0.{rank % 250}]:{20000 + rank}")
                except RuntimeError:
                    pass
    code, result, _ = as_json(capsys, tmp_path)
    assert diagnose(capsys, tmp_path)[0] == code == 1 and result["verdict"] == "failed"
    text = diagnose(capsys, tmp_path)[1]
    assert (result["first"]["rank"], result["first"]["step"], result["first"]["kind"]) == (7, 4, "exception")
    assert len(result["cascade"]) >= ranks - 1  # --json keeps each
    assert (result["before"]["rank"], result["before"]["step"], result["before"]["kind"]) == (7, 3, "anomaly")
    lines = text.splitlines()
    assert len(lines) <= 40, text
    assert "before it on the same rank: step 3, actor_update: anomaly: actor/pg_loss is nan" in text
    assert "ranks 0-6, 8-1023: step 4, actor_update: exception: RuntimeError: [gloo] Connection closed" in text
    assert "(1023 alike)" in text and any("verl-events triage" in line for line in lines), text
    # hangs folds its ranks too: one line for the 1,024 alike.
    assert main(["hangs", str(tmp_path)]) == 0
    hangs = capsys.readouterr().out
    assert len(hangs.splitlines()) <= 5 and "ranks 0-1023: closed (normal)" in hangs and "(1024 alike" in hangs
