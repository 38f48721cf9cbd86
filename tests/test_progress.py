"""Progress with no stage open, and liveness across clocks: real processes, real deadlines.

* two gloo ranks, rank 1 idle before its first stage and again between stages while rank 0
  waits for it in all_reduce: each stall named with rank 1's line and every thread's stack;
* a process stuck before any stage and then SIGKILLed: ``diagnose`` calls the run hung, with
  the stall first, from no heartbeat at all;
* two live ranks whose clocks disagree by 30 s (one process's clock and host name moved, as a
  second host's would be): neither reads as dead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_events.apps.cli import main
from verl_events.observers.watchdog.stall_record import StallRecord, stalls_log_path

from .hang_support import DEADLINE, gloo_ranks, line_of, wait_for
from .support import end_processes, verl_events_exe

__all__ = ["gloo_ranks"]  # the fixture, used here


def stall_lines(run: Path) -> list[StallRecord]:
    path = stalls_log_path(run)
    return [StallRecord.from_json(line) for line in path.read_text().splitlines()] if path.exists() else []


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_a_rank_idle_before_its_first_stage_and_between_stages_is_named_with_its_line_and_stacks(
    tmp_path: Path, gloo_ranks: object, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    ranks = gloo_ranks(  # type: ignore[operator]
        """
        if rank == 1:
            time.sleep(7)
        with verl_events.stage("actor_compute_log_prob", step=1):
            dist.all_reduce(torch.ones(1))
        if rank == 1:
            time.sleep(8)
        with verl_events.stage("actor_update", step=1):
            dist.all_reduce(torch.ones(1))
        """,
        stall_s=DEADLINE,
    )
    run, script = tmp_path / "run", tmp_path / "two_ranks.py"
    for process in ranks:
        assert process.wait(timeout=90) == 0, process.communicate()[0]
    stalls = [r for r in stall_lines(run) if r.kind == "stall"]
    # Rank 0 was never idle past its deadline: it waited inside its stages, in all_reduce.
    assert len(stalls) == 2 and {r.pid for r in stalls} == {ranks[1].pid}, stalls
    before, between = sorted(stalls, key=lambda r: r.time)
    assert before.after is None and before.where["line"] == line_of(script, "time.sleep(7)")  # type: ignore[index]
    assert between.after == {"stage": "actor_compute_log_prob", "step": 1, "rank": 1}
    assert between.where["line"] == line_of(script, "time.sleep(8)")  # type: ignore[index]
    for record in stalls:
        assert record.thread == "MainThread" and record.deadline_s == DEADLINE
        report = (run / str(record.report)).read_text()
        assert f">> File '{script}', line {record.where['line']}" in report  # type: ignore[index]
    resumed = {r.began: r for r in stall_lines(run) if r.kind == "resumed"}
    assert resumed[before.began].next == {"stage": "actor_compute_log_prob", "step": 1, "rank": 1}
    assert resumed[between.began].next == {"stage": "actor_update", "step": 1, "rank": 1}
    assert all(resumed[r.began].elapsed_s >= 7 for r in stalls)

    # Rank 0 waited for rank 1 in a collective: that does not explain rank 1's idle time.
    code, hangs = cli_json(capsys, "hangs", str(run))
    assert code == 1 and [s["state"] for s in hangs["stalls"]] == ["resumed", "resumed"]  # type: ignore[index]
    text = subprocess.run([verl_events_exe(), "hangs", str(run)], capture_output=True, text=True, timeout=60).stdout
    assert f"stalled, then resumed: process {ranks[1].pid} (rank 1)" in text
    assert f"at {script}:{line_of(script, 'time.sleep(8)')} in <module>: time.sleep(8)" in text
    code, verdict = cli_json(capsys, "diagnose", str(run))
    assert code == 1 and verdict["verdict"] == "anomalous"  # every stage ended, every stall resumed
    found = [verdict["first"], *verdict["cascade"]]  # type: ignore[list-item]
    idle = [f for f in found if f["source"] == "stalls.jsonl"]
    assert [(f["rank"], f["kind"]) for f in idle] == [(1, "slow"), (1, "slow")]
    assert "before its first stage" in idle[0]["detail"] and "after actor_compute_log_prob" in idle[1]["detail"]


STUCK_SCRIPT = """\
import sys, threading
sys.path.insert(0, {repo!r})
import verl_events

def wait_for_storage_units():
    threading.Event().wait()

with verl_events.install({{"save_path": {save_path!r}, "observers": [{{"name": "watchdog", "stall_s": 1.0}}]}}):
    wait_for_storage_units()
"""


@pytest.mark.slow
def test_a_process_stuck_before_any_stage_and_then_killed_is_a_hung_run_with_the_stall_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, script = tmp_path / "run", tmp_path / "stuck.py"
    script.write_text(STUCK_SCRIPT.format(repo=str(Path(__file__).resolve().parents[1]), save_path=str(run)))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: stall_lines(run), 60)
        os.kill(process.pid, signal.SIGKILL)  # a launcher's timeout
        process.wait(timeout=30)
    finally:
        end_processes([process])  # type: ignore[list-item]
    assert not (run / "heartbeats").exists() or not list((run / "heartbeats").glob("rank*.json"))
    code, verdict = cli_json(capsys, "diagnose", str(run))
    assert code == 1 and verdict["verdict"] == "hung", verdict
    first = verdict["first"]
    assert (first["kind"], first["pid"], first["stage"]) == ("stall", process.pid, None)  # type: ignore[index]
    assert first["where"]["function"] == "wait_for_storage_units"  # type: ignore[index]
    text = subprocess.run([verl_events_exe(), "hangs", str(run)], capture_output=True, text=True, timeout=60)
    assert text.returncode == 1 and f"STALL: process {process.pid} (no rank: {sys.executable} {script})" in text.stdout
    assert f"{script}:{line_of(script, 'threading.Event().wait()')} in wait_for_storage_units" in text.stdout

    # Damaged neighbours (another writer's, a copy cut short) change nothing and raise nothing.
    (run / "heartbeats").mkdir(exist_ok=True)
    damaged = {"run": None, "rank": 3, "time": 1.0, "open": ["x", {"stage": {"a": 1}, "since": "soon"}]}
    (run / "heartbeats/rank3.json").write_text(json.dumps(damaged))
    (run / "timing").mkdir(exist_ok=True)
    line = {"event": "stage", "stage": {"a": 1}, "rank": "0", "step": [1], "elapsed_s": "fast", "end_unix": 1e400}
    (run / "timing/rank0.jsonl").write_text(json.dumps(line).replace("Infinity", "1e400") + "\n")
    code, verdict = cli_json(capsys, "diagnose", str(run))
    assert code == 1 and verdict["verdict"] == "hung" and verdict["first"]["kind"] == "stall", verdict  # type: ignore[index]
    text = subprocess.run([verl_events_exe(), "hangs", str(run)], capture_output=True, text=True, timeout=60)
    assert text.returncode == 1 and "Traceback" not in text.stderr and "STALL:" in text.stdout, text.stderr


SKEWED_SCRIPT = """\
import socket, sys, time
rank, skew, host, save_path, stop = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
if skew:  # this process's clock and host name as a second host's would be
    real = time.time
    time.time = lambda: real() + skew
    socket.gethostname = lambda: host
sys.path.insert(0, {repo!r})
import os
import verl_events

config = {{"save_path": save_path, "observers": [{{"name": "watchdog", "heartbeat_s": 0.2, "liveness_s": 0.5}}]}}
with verl_events.install(config):
    with verl_events.stage("actor_update", step=1, rank=rank):
        while not os.path.exists(stop):
            time.sleep(0.05)
"""


@pytest.mark.slow
def test_two_live_ranks_whose_clocks_disagree_by_30_s_both_read_as_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, script, stop = tmp_path / "run", tmp_path / "skewed.py", tmp_path / "stop"
    script.write_text(SKEWED_SCRIPT.format(repo=str(Path(__file__).resolve().parents[1])))
    env = {**os.environ, "VERL_EVENTS_RUN_ID": "skewed-clocks"}
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(skew), "node-b", str(run), str(stop)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank, skew in ((0, 0.0), (1, 30.0))
    ]
    try:
        beats = run / "heartbeats"
        wait_for(lambda: len(list(beats.glob("rank*.json"))) == 2, 60)
        time.sleep(3)  # six liveness beats: long enough for rank 0 to be "three beats behind" rank 1
        code, verdict = cli_json(capsys, "diagnose", str(run))
        assert code == 0 and verdict["verdict"] == "running" and verdict["first"] is None, verdict
        text = subprocess.run([verl_events_exe(), "hangs", str(run)], capture_output=True, text=True, timeout=60)
        assert text.returncode == 0 and "STOPPED" not in text.stdout, text.stdout
        assert text.stdout.count(": running, ") == 2
        stop.touch()
        assert [p.wait(timeout=60) for p in processes] == [0, 0]
    finally:
        end_processes(processes)  # type: ignore[arg-type]
    code, verdict = cli_json(capsys, "diagnose", str(run))
    assert code == 0 and verdict["verdict"] == "healthy"


def test_stall_options_are_checked_with_a_sentence_naming_the_key() -> None:
    from verl_events import ConfigError
    from verl_events.observers.watchdog import WatchdogObserver

    for bad in ("5", 0, -1.0, True, float("nan")):
        with pytest.raises(ConfigError, match=r"option stall_s: .* is not allowed; use a number of seconds > 0, null"):
            WatchdogObserver(stall_s=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="option start_s: 0 is not allowed"):
        WatchdogObserver(start_s=0)
    assert "no stall deadline" in WatchdogObserver(stall_s=False).describe()
    assert "stall deadline 30 s" in WatchdogObserver(stall_s=30).describe()
