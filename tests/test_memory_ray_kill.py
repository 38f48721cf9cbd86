"""A rank that Ray's memory monitor kills, for real, and what diagnose makes of it (issue 28).

A driver runs in a session of its own and starts a local Ray (one CPU, no dashboard) whose
memory monitor has a threshold 3 GiB above the node's use when the test starts
(``RAY_memory_usage_threshold``, read when Ray starts, so only that driver's environment
has it).  Its output goes to ``{save_path}/trainer.log``, where ``verl-events demo`` puts
verl's.  Two actors run stages with the watchdog and the memory observer:

* rank 0 allocates inside step 2's ``actor_update`` until Ray's memory monitor kills it.
  The driver's ``ray.get`` raises ``ray.exceptions.OutOfMemoryError``, whose report names
  the node's figures and rank 0's pid;
* rank 1 then SIGKILLs itself inside step 2's ``actor_update``: the driver gets an
  ``ActorDiedError``, as it would for the kernel's OOM killer.  That is no kill of Ray's
  memory monitor, and diagnose must not say it is.

The test's cleanup (:func:`run_in_own_session`) waits for the driver's session to empty
and kills, by pid, whatever of it is left.  Ray's memory monitor kills only its own
workers: no other process on the node is touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray's memory monitor needs ray (the verl-cpu extra)")

from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.read.ray_kills import DRIVER_LOG
from verl_events.apps.verl_cpu.session import run_in_own_session
from verl_events.observers.memory.oom import out_of_memory, ray_memory_kills
from verl_events.observers.memory.record import memory_log_path
from verl_events.observers.watchdog.record import watchdog_files

from .support import REPO

pytestmark = pytest.mark.slow

GIB = 2**30
#: The threshold stands this far above the node's use at the start: Ray's own processes
#: take about 0.8 GiB of it, rank 0 the rest.
MARGIN = 3 * GIB
#: Rank 0 stops here if Ray has not killed it (the test then fails), far below this machine's 24 GiB.
CAP = 7 * GIB
TIMEOUT_S = 120

DRIVER = """\
import os, signal, sys, time, traceback
import ray

SAVE_PATH = {save_path!r}
CONFIG = {{"save_path": SAVE_PATH, "observers": [
    {{"name": "watchdog", "heartbeat_s": 0.1, "liveness_s": 0.5}}, {{"name": "memory"}}]}}


@ray.remote(max_restarts=0)
class Rank:
    def run(self, rank, cap):
        import verl_events
        from verl_events.observers.watchdog.record import heartbeat_path

        with verl_events.install(CONFIG):
            with verl_events.stage("actor_update", role="actor", step=1, rank=rank):
                pass
            # diagnose names a killed rank from its heartbeat, written from its first stage on.
            while not heartbeat_path(SAVE_PATH, rank).exists():
                time.sleep(0.05)
            time.sleep(0.3)
            held = []
            with verl_events.stage("actor_update", role="actor", step=2, rank=rank):
                if rank == 1:
                    time.sleep(0.3)  # a heartbeat with step 2 open first
                    os.kill(os.getpid(), signal.SIGKILL)
                while len(held) * 2**26 < cap:
                    held.append(b"x" * 2**26)  # 64 MiB, written: resident
                    time.sleep(0.02)
        return "not killed"


ray.init(address="local", num_cpus=1, include_dashboard=False)
try:
    try:
        print("rank 0:", ray.get(Rank.remote().run.remote(0, {cap})), flush=True)
    except ray.exceptions.OutOfMemoryError:
        traceback.print_exc()
    sys.stderr.flush()
    print("rank 1:", ray.get(Rank.remote().run.remote(1, 0)), flush=True)
finally:
    ray.shutdown()
"""


def node_used_bytes() -> tuple[int, int]:
    """The node's total memory and what is in use (total less available), as Ray counts it."""
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total, available = (int(meminfo[key].split()[0]) * 1024 for key in ("MemTotal", "MemAvailable"))
    return total, total - available


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, float]:
    """The run folder, the driver's output and the driver's wall time."""
    root = tmp_path_factory.mktemp("ray_kill")
    save_path = root / "run"
    save_path.mkdir()
    script = root / "driver.py"
    script.write_text(DRIVER.format(save_path=str(save_path), cap=CAP))
    total, used = node_used_bytes()
    threshold = (used + MARGIN) / total
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VERL_EVENTS_"))},
        "RAY_memory_usage_threshold": f"{threshold:.4f}",
        "RAY_memory_monitor_refresh_ms": "50",
        "PYTHONPATH": str(REPO),
    }
    log = save_path / DRIVER_LOG
    started = time.monotonic()
    with log.open("w") as output:
        code = run_in_own_session([sys.executable, str(script)], env, output, timeout=TIMEOUT_S)
    took = time.monotonic() - started
    text = log.read_text()
    assert code == 1, text[-4000:]
    return save_path, text, took


def diagnose(capsys: pytest.CaptureFixture[str], run: Path, *flags: str) -> tuple[int, dict[str, Any], str]:
    code = verl_events_main(["diagnose", str(run), "--json", *flags])
    result = json.loads(capsys.readouterr().out)
    assert verl_events_main(["diagnose", str(run), *flags]) == code
    return code, result, capsys.readouterr().out


def test_the_driver_gets_rays_out_of_memory_error_and_then_an_actor_died_error(
    ray_run: tuple[Path, str, float],
) -> None:
    save_path, log, took = ray_run
    print(f"the driver ran {took:.1f} s")
    assert "ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running low" in log, log[-4000:]
    assert "ray.exceptions.ActorDiedError" in log and "rank 0: not killed" not in log, log[-4000:]
    (report, *_) = ray_memory_kills(log)
    pids = {json.loads(line)["pid"] for line in memory_log_path(save_path, 0).read_text().splitlines()}
    assert [worker.pid for worker in report.killed] == list(pids)


def test_diagnose_names_rank_0_its_stage_and_rays_memory_monitor_and_rank_1_only_killed(
    ray_run: tuple[Path, str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    save_path, log, _ = ray_run
    code, result, text = diagnose(capsys, save_path)
    print(text)
    assert code == 1 and result["verdict"] == "failed", text
    first = result["first"]
    assert (first["rank"], first["step"], first["stage"], first["kind"]) == (0, 2, "actor_update", "oom"), text
    assert first["detail"].startswith(f"killed by Ray's memory monitor ({DRIVER_LOG}): node "), text
    used, limit = re.search(r"was (\d+\.\d+)GB used / (\d+\.\d+)GB limit", log).groups()  # type: ignore[union-attr]
    assert f" at {used} GiB used / {limit} GiB limit (threshold " in first["detail"], (log[-4000:], text)
    assert "; at the end of actor_update (step 1) it held " in first["detail"]
    assert "without closing" in first["detail"]  # what the heartbeat said stays, after the cause
    assert "step 2, actor_update: oom: killed by Ray's memory monitor" in text
    # rank 1's SIGKILL (Ray's ActorDiedError) is a death, and not Ray's memory monitor's.
    (rank_1,) = [item for item in result["cascade"] if item["rank"] == 1]
    assert (rank_1["kind"], rank_1["step"], rank_1["stage"]) == ("killed", 2, "actor_update"), text
    assert "memory" not in rank_1["detail"] and "OOM" not in rank_1["detail"], text


def test_the_driver_log_given_with_log_names_the_same_rank_and_without_it_rank_0_is_only_killed(
    ray_run: tuple[Path, str, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_path, _, _ = ray_run
    run = tmp_path / "run"
    shutil.copytree(save_path, run)
    driver_log = tmp_path / "driver.log"
    (run / DRIVER_LOG).rename(driver_log)
    _, result, _ = diagnose(capsys, run)
    assert (result["first"]["rank"], result["first"]["kind"]) == (0, "killed")
    assert "Ray" not in result["first"]["detail"]
    _, result, _ = diagnose(capsys, run, "--log", str(driver_log))
    assert (result["first"]["rank"], result["first"]["kind"]) == (0, "oom")
    assert result["first"]["detail"].startswith(f"killed by Ray's memory monitor ({driver_log}): ")


def test_without_the_watchdog_the_memory_records_pid_names_the_rank_and_where_since_is_unknown(
    ray_run: tuple[Path, str, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same run as if only the memory observer had run: the watchdog's files removed."""
    save_path, _, _ = ray_run
    run = tmp_path / "run"
    shutil.copytree(save_path, run)
    for path in watchdog_files(run):
        path.unlink()
    code, result, text = diagnose(capsys, run)
    assert code == 1, text
    first = result["first"]
    assert (first["rank"], first["step"], first["stage"], first["kind"]) == (0, 1, "actor_update", "oom"), text
    assert first["detail"].startswith(f"killed by Ray's memory monitor ({DRIVER_LOG}): "), text
    assert first["source"] == "memory/rank0.jsonl"
    assert "rank 0, pid " in text and ": after step 1's actor_update, where since unknown: oom: killed by Ray's" in text


# -- Ray's report as Ray 2.60 wrote it on this machine, most of its object-store table left out -------

REPORT = """\
ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running low on memory. \
Memory on the node (IP: 192.0.2.2, ID: ce48b78cfb84727991d4203a506e8766d5f5e181e0f0ef09f61f85cc) was 2.22GB used \
/ 23.54GB limit (0.094116)
OOM kill reason: Memory usage 2379227136B exceeded threshold of 2340556800B (9.3% of 25275990016B limit)
Object store memory usage: [- objects spillable: 0
- bytes spillable: 0
(global lru) bytes evicted: 0]
Ray killed 1 worker(s) based on the killing policy
Considered workers: [
Selected to kill: (Actor(10d4f9cacd086ed579cc6cbc01000000): job ID=01000000, \
lease ID=000000001a645fa0d74edf4b13d1ac8a095c6124f9936780f6772d8d8ea78a81, task name=Rank.__init__, \
required resources={CPU: 1}, pid=4580, actual memory used=0.69GB, \
worker ID=41c2d23fccf50dee2b1e3320afd209dfbc6cfb7e770449f4c844dde4)
]
Total non-selected idle workers: 0
Total non-selected idle workers USS bytes: 0.00GB
Top 10 memory users: PID	MEM(GB)	COMMAND
4580	0.69	ray::Rank.run
4406	0.07	python exp_driver.py /tmp/helperA/run1
"""

#: What Ray 2.60's driver got here for a worker that was SIGKILLed, as the kernel's OOM killer does.
ACTOR_DIED = (
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task. The actor is dead "
    "because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly "
    "exits with a connection error code 2. End of file. Some common causes include: (1) the process was killed by "
    "the OOM killer due to high memory usage, (2) ray stop --force was called, or (3) the worker crashed "
    "unexpectedly due to SIGSEGV or other unexpected errors. (verifiable by checking for OOM in dmesg of the "
    "OOMing node)"
)


def test_rays_report_gives_the_node_the_threshold_and_each_killed_pid() -> None:
    (report,) = ray_memory_kills(REPORT)
    assert (report.workers, report.node_ip, report.threshold_bytes) == (1, "192.0.2.2", 2340556800)
    assert (round(report.used_bytes / GIB, 2), round(report.limit_bytes / GIB, 2)) == (2.22, 23.54)
    (worker,) = report.killed
    assert (worker.pid, round(worker.used_bytes / GIB, 2), worker.task) == (4580, 0.69, "Rank.__init__")
    assert worker.worker_id.startswith("41c2d23f")
    # A traceback that repeats the report, in colour as Ray prints a worker's lines: each time.
    coloured = "\x1b[36m(TaskRunner pid=6340)\x1b[0m " + REPORT
    assert [r.killed[0].pid for r in ray_memory_kills(coloured + REPORT)] == [4580, 4580]


def test_a_report_cut_to_500_characters_keeps_the_node_and_loses_the_pids() -> None:
    """The watchdog keeps 500 characters of an exception's message (``crashes/ends.jsonl``)."""
    (report,) = ray_memory_kills(REPORT[:500])
    assert (report.workers, report.killed) == (1, ())


def test_an_actor_died_error_and_a_kernel_sigkill_are_not_rays_memory_monitor() -> None:
    assert ray_memory_kills(ACTOR_DIED) == []
    assert ray_memory_kills(f"SIGKILL: exit {-signal.SIGKILL}") == []
    assert out_of_memory(ACTOR_DIED) is None


def test_diagnose_refuses_a_log_that_is_not_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert verl_events_main(["diagnose", str(tmp_path), "--log", str(tmp_path / "nowhere.log")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --log {tmp_path / 'nowhere.log'} does not exist; pass the driver's output"
    )


def test_the_driver_log_is_where_the_demo_puts_verls_output() -> None:
    from verl_events.apps.demo.verl_engine import TRAINER_LOG

    assert DRIVER_LOG == TRAINER_LOG
