"""``verl-events diagnose`` on two real gloo ranks, rank 1 dying inside step 2's ``actor_update`` in
each way ranks die: an exception, SIGKILL, a segfault, SIGTERM; and a launcher stopping rank 1
after rank 0 raised.  Every death is real (a signal sent to the process, ctypes reading address 0);
nothing is written by hand.  Each asserts the first failure (rank, step, stage, kind, line) and the
cascade; and ``hangs`` never calls the dead rank running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .support import LEAVE_WITHOUT_TEARDOWN, end_processes, start_rank_pair, verl_events_exe

pytestmark = pytest.mark.slow

RANK_SCRIPT = """\
import ctypes, os, signal, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, {repo!r})
import verl_events

rank = int(sys.argv[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=rank, world_size=2)
config = {{"save_path": {save_path!r}, "observers": [
    {{"name": "watchdog", "timeout_s": 30, "heartbeat_s": 0.1, "liveness_s": 0.5}}, {{"name": "timing"}}]}}
with verl_events.install(config):
    for step in (1, 2, 3):
        with verl_events.stage("actor_update", step=step):
            if step == 2:
{fault}
            dist.all_reduce(torch.ones(1))
print("done", flush=True)
{leave}
"""


def diagnose(run: Path) -> tuple[int, dict[str, Any], str]:
    as_json = subprocess.run(
        [verl_events_exe(), "diagnose", str(run), "--json"], capture_output=True, text=True, timeout=120
    )
    text = subprocess.run([verl_events_exe(), "diagnose", str(run)], capture_output=True, text=True, timeout=120)
    assert as_json.returncode == text.returncode, text.stderr
    return as_json.returncode, json.loads(as_json.stdout), text.stdout


@pytest.fixture
def two_ranks(tmp_path: Path) -> Iterator[Any]:
    """``start(fault)`` runs RANK_SCRIPT as ranks 0 and 1 with ``fault`` inside step 2's
    actor_update; returns the two processes.  Anything left at the end is killed by its PID."""
    pytest.importorskip("torch")
    started: list[subprocess.Popen[str]] = []

    def start(fault: str) -> list[subprocess.Popen[str]]:
        script = tmp_path / "ranks.py"
        script.write_text(
            RANK_SCRIPT.format(
                repo=str(Path(__file__).resolve().parents[1]),
                save_path=str(tmp_path / "run"),
                fault=textwrap.indent(textwrap.dedent(fault).strip("\n"), " " * 16),
                leave=LEAVE_WITHOUT_TEARDOWN,
            )
        )
        started.extend(start_rank_pair(script, "postmortem"))
        return started

    yield start
    end_processes(started)


def finish(processes: list[subprocess.Popen[str]]) -> list[int]:
    codes = []
    for process in processes:
        process.communicate(timeout=120)
        codes.append(process.returncode)
    return codes


def line_of(script: Path, text: str) -> int:
    return next(n for n, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def assert_first(result: dict[str, Any], rank: int, kind: str) -> dict[str, Any]:
    first = result["first"]
    assert result["verdict"] == "failed", result
    assert (first["rank"], first["step"], first["stage"], first["kind"]) == (rank, 2, "actor_update", kind), result
    assert first["pid"] is not None and first["host"] is not None
    return first


def assert_rank_0_followed(result: dict[str, Any]) -> None:
    """Rank 0's all-reduce lost its peer: a cascade item, never the first failure."""
    (cascade,) = [c for c in result["cascade"] if c["rank"] == 0]
    assert cascade["kind"] == "exception" and cascade["stage"] == "actor_update" and cascade["step"] == 2
    assert "peer" in cascade["why"] or "gloo" in cascade["why"].lower(), cascade
    assert cascade["time"] >= result["first"]["time"]


def test_a_healthy_run_is_healthy(tmp_path: Path, two_ranks: Any) -> None:
    assert finish(two_ranks("pass")) == [0, 0]
    code, result, text = diagnose(tmp_path / "run")
    assert code == 0 and result["verdict"] == "healthy" and result["first"] is None and result["cascade"] == []
    assert {t["tool"] for t in result["tools"]} == {"watchdog", "timing"}
    assert text.splitlines()[1] == "verdict: healthy"


def test_an_exception_names_the_rank_the_message_and_the_line(tmp_path: Path, two_ranks: Any) -> None:
    codes = finish(two_ranks('if rank == 1:\n    raise RuntimeError("rank 1 got a batch of 0 samples")'))
    assert codes[1] == 1 and codes[0] != 0
    code, result, text = diagnose(tmp_path / "run")
    assert code == 1
    first = assert_first(result, 1, "exception")
    assert first["detail"] == "RuntimeError: rank 1 got a batch of 0 samples"
    script = tmp_path / "ranks.py"
    assert first["where"]["file"] == str(script)
    assert first["where"]["line"] == line_of(script, "raise RuntimeError")
    assert_rank_0_followed(result)
    assert "rank 1 got a batch of 0 samples" in text and f"{script}:{first['where']['line']}" in text


def test_a_rank_killed_with_sigkill_is_first_although_it_wrote_nothing(tmp_path: Path, two_ranks: Any) -> None:
    codes = finish(two_ranks("if rank == 1:\n    time.sleep(1.0)\n    os.kill(os.getpid(), signal.SIGKILL)"))
    assert codes[1] == -signal.SIGKILL and codes[0] != 0
    code, result, _ = diagnose(tmp_path / "run")
    assert code == 1
    first = assert_first(result, 1, "killed")
    assert "is gone" in first["detail"]
    # Killed a second into the stage, with a beat every 0.5 s: placed inside it, never "as it began".
    assert "s into the stage, at " in first["detail"] and "as the stage began" not in first["detail"], first
    assert_rank_0_followed(result)
    hangs = subprocess.run([verl_events_exe(), "hangs", str(tmp_path / "run")], capture_output=True, text=True)
    rank_1 = next(line for line in hangs.stdout.splitlines() if line.strip().startswith("rank 1:"))
    assert "running" not in rank_1 and "STOPPED" in rank_1 and "inside step 2's actor_update" in rank_1, hangs.stdout


def test_a_segfault_leaves_its_stack_and_is_first(tmp_path: Path, two_ranks: Any) -> None:
    codes = finish(two_ranks("if rank == 1:\n    time.sleep(0.3)\n    ctypes.string_at(0)"))
    assert codes[1] == -signal.SIGSEGV and codes[0] != 0
    code, result, _ = diagnose(tmp_path / "run")
    assert code == 1
    first = assert_first(result, 1, "signal")
    assert first["detail"].startswith("SIGSEGV")
    script = tmp_path / "ranks.py"
    assert (first["where"]["file"], first["where"]["line"]) == (str(script), line_of(script, "ctypes.string_at(0)"))
    assert first["source"] == "crashes/rank1.fatal.txt"
    assert_rank_0_followed(result)


def test_sigterm_is_recorded_and_first(tmp_path: Path, two_ranks: Any) -> None:
    codes = finish(two_ranks("if rank == 1:\n    time.sleep(0.3)\n    os.kill(os.getpid(), signal.SIGTERM)"))
    assert codes[1] == -signal.SIGTERM and codes[0] != 0  # the process ends as it would without the watchdog
    code, result, _ = diagnose(tmp_path / "run")
    assert code == 1
    first = assert_first(result, 1, "signal")
    assert first["detail"] == "SIGTERM" and first["source"] == "crashes/rank1.SIGTERM.txt"
    script = tmp_path / "ranks.py"
    assert first["where"]["line"] == line_of(script, "os.kill(os.getpid(), signal.SIGTERM)")
    assert_rank_0_followed(result)
    # A copy that did not keep the dump's time (a download): the heartbeat bounds it, rank 1 stays first.
    dump = tmp_path / "run/crashes/rank1.SIGTERM.txt"
    os.utime(dump, (first["time"] + 600, first["time"] + 600))
    _, copied, _ = diagnose(tmp_path / "run")
    assert copied["first"]["rank"] == 1 and copied["first"]["time"] <= first["time"]


def test_a_launcher_stopping_the_survivor_after_an_exception_is_cascade(tmp_path: Path, two_ranks: Any) -> None:
    """As torchrun does: rank 0 raised; a second later rank 1, still computing, gets SIGTERM."""
    processes = two_ranks(
        """
        if rank == 0:
            raise ValueError("advantages are NaN")
        time.sleep(20)  # a long step: the launcher's SIGTERM lands here
        """
    )
    processes[0].communicate(timeout=120)
    time.sleep(1.0)
    os.kill(processes[1].pid, signal.SIGTERM)
    assert finish(processes) == [1, -signal.SIGTERM]
    code, result, _ = diagnose(tmp_path / "run")
    assert code == 1
    first = assert_first(result, 0, "exception")
    assert first["detail"] == "ValueError: advantages are NaN"
    (cascade,) = result["cascade"]
    assert (cascade["rank"], cascade["kind"], cascade["detail"]) == (1, "signal", "SIGTERM")
    assert "launcher" in cascade["why"] and cascade["time"] > first["time"]
    assert cascade["where"]["line"] == line_of(tmp_path / "ranks.py", "time.sleep(20)")


# -- a launcher's shutdown (Ray ends every worker with SIGTERM when the driver is done) -----

WORKER = """\
import os, signal, sys, time
sys.path.insert(0, {repo!r})
signal.signal(signal.SIGTERM, lambda number, frame: os._exit(0))  # as Ray's worker does: no atexit
import verl_events
verl_events.install({{"save_path": {save_path!r}, "observers": [{{"name": "watchdog", "heartbeat_s": 0.05}}]}})
with verl_events.stage("actor_update", step=1):
    time.sleep(0.2)
print("between stages", flush=True)
time.sleep(60)
"""
DRIVER = """\
import sys
sys.path.insert(0, {repo!r})
import verl_events
verl_events.install({{"save_path": {save_path!r}, "observers": [{{"name": "watchdog"}}]}})
{end}
"""


@pytest.mark.parametrize("driver_raises", [False, True])
def test_the_launchers_sigterm_after_the_driver_ended_normally_is_teardown_not_a_failure(
    tmp_path: Path, driver_raises: bool
) -> None:
    repo, run = str(Path(__file__).resolve().parents[1]), str(tmp_path / "run")
    env = {**os.environ, "VERL_EVENTS_RUN_ID": "teardown-test"}
    (tmp_path / "worker.py").write_text(WORKER.format(repo=repo, save_path=run))
    end = 'raise RuntimeError("ray.get failed")' if driver_raises else "pass"
    (tmp_path / "driver.py").write_text(DRIVER.format(repo=repo, save_path=run, end=end))
    worker = subprocess.Popen([sys.executable, str(tmp_path / "worker.py")], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "between stages\n"
        driver = subprocess.run([sys.executable, str(tmp_path / "driver.py")], capture_output=True, env=env)
        assert driver.returncode == (1 if driver_raises else 0)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0  # the worker's own handler still ends it, as without us
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.communicate(timeout=30)
    code, result, text = diagnose(tmp_path / "run")
    if driver_raises:
        assert code == 1 and result["verdict"] == "failed"
        # A process that ran no stage has no rank (-2); the driver where verl's loop runs has -1.
        assert (result["first"]["rank"], result["first"]["detail"]) == (-2, "RuntimeError: ray.get failed")
        (cascade,) = result["cascade"]
        assert (cascade["rank"], cascade["detail"]) == (0, "SIGTERM") and "launcher" in cascade["why"]
        assert "a process without a rank (main_ppo, a launcher)" in text
    else:
        assert code == 0 and result["verdict"] == "healthy" and result["cascade"] == []
        assert [(t["rank"], t["detail"]) for t in result["teardown"]] == [(0, "SIGTERM")]
        assert "the launcher stopped rank(s) 0 between stages (not a failure)" in text


KILLED_AS_IT_BEGINS = """\
import sys, time
sys.path.insert(0, {repo!r})
import verl_events

config = {{"save_path": {save_path!r}, "observers": [
    {{"name": "watchdog", "timeout_s": 30, "heartbeat_s": 3.0, "liveness_s": 2.0}}, {{"name": "timing"}},
    {{"_target_": "tests.support:Killer", "step": 2, "rank": 0, "seconds": 0, "stages": ["actor_update"]}}]}}
with verl_events.install(config):
    for step in (1, 2):
        if step == 2:
            time.sleep(3.5)  # the heartbeat is written now; the next write is 3 s away
        for stage in ("ref_compute_log_prob", "actor_update"):
            with verl_events.stage(stage, step=step):
                pass
"""


def test_a_rank_killed_as_a_stage_begins_is_placed_in_that_stage_by_its_boundary_record(tmp_path: Path) -> None:
    """SIGKILL in ``on_stage_begin`` of step 2's ``actor_update``, two boundaries after the last
    heartbeat was written: the heartbeat alone says the rank was between step 1's
    ``actor_update`` and the next stage; the boundary record, stored at each boundary, says where."""
    pytest.importorskip("torch")
    from verl_events.observers.watchdog.record import Heartbeat, heartbeat_path

    script = tmp_path / "killed.py"
    repo = Path(__file__).resolve().parents[1]
    script.write_text(KILLED_AS_IT_BEGINS.format(repo=str(repo), save_path=str(tmp_path / "run")))
    env = {**os.environ, "PYTHONPATH": str(repo)}
    process = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert process.returncode == -signal.SIGKILL, process.stderr
    written = Heartbeat.from_json(heartbeat_path(tmp_path / "run", 0).read_bytes())
    assert written.open == [] and written.last_ended is not None and written.last_ended["step"] == 1  # behind
    code, result, text = diagnose(tmp_path / "run")
    first = result["first"]
    assert code == 1 and (first["rank"], first["kind"], first["step"], first["stage"]) == (
        0,
        "killed",
        2,
        "actor_update",
    )
    assert "stage-boundary record, newer than its last heartbeat" in first["detail"], first
    assert "killed as the stage began (within 2 s of it: no beat after its beginning" in first["detail"], first
    assert "killed as the stage began" in text
