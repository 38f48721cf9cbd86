"""A stall with no stage open, on verl 0.9.1's default (v1) trainer: ``main_ppo`` under Ray, on CPU.

TransferQueue starts ``num_data_storage_units`` storage units (8 by default), each asking Ray for a
CPU; on this job's 8 CPUs the eighth never starts, and the driver waits in ``tq.init`` forever,
before any stage, printing nothing.  Here the always-on set runs with a stall deadline of 10 s,
and the job is ended (every Ray process killed) after 75 s, as a launcher's timeout would:

- the driver (verl's ``TaskRunner``) reports the stall with its stacks, at ``tq.init``'s line, and
  ``main_ppo`` reports its own wait for the driver;
- ``diagnose`` calls the run hung, with the driver's stall first (``main_ppo`` waits on it in
  ``ray.get``), and ``hangs`` shows both, though no rank ever wrote a heartbeat.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")

from verl_events.apps.verl_cpu import job
from verl_events.observers.watchdog.stall_record import StallRecord, stalls_log_path

from . import support

REPO = Path(__file__).parent.parent
STALL_S = 10.0
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stall")
    files = job.prepare(root / "job")
    config = {
        "preset": "always_on",
        "save_path": str(root / "profile"),
        "observers": [{"name": "watchdog", "stall_s": STALL_S}],
    }
    (root / "observers.yaml").write_text(json.dumps(config))  # JSON is YAML
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env = job.trainer_env(base) | {"VERL_EVENTS_CONFIG": str(root / "observers.yaml"), "PYTHONPATH": str(REPO)}
    eight_units = "transfer_queue.backend.SimpleStorage.num_data_storage_units=8"  # TransferQueue's default
    overrides = job.merge_overrides(job.trainer_args(files, steps=1), [eight_units])
    with pytest.raises(subprocess.TimeoutExpired):  # it hangs: the job is ended as a launcher would
        job.run_trainer(overrides, env, log=root / "trainer.log", timeout=75)
    return root / "profile"


def stall_lines(run: Path) -> list[StallRecord]:
    return [StallRecord.from_json(line) for line in stalls_log_path(run).read_text().splitlines()]


def verl_events_cli(*args: str) -> tuple[int, str]:
    result = subprocess.run([support.verl_events_exe(), *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout


def test_the_driver_stuck_in_tq_init_reports_its_stall_with_the_line_and_every_threads_stack(run: Path) -> None:
    stalls = [r for r in stall_lines(run) if r.kind == "stall"]
    assert not [r for r in stall_lines(run) if r.kind == "resumed"]  # nothing ever began, nothing ended well
    assert not list((run / "heartbeats").glob("rank*.json"))  # no rank began a stage
    reports = {r.pid: (run / str(r.report)).read_text() for r in stalls}
    driver = [r for r in stalls if "tq.init(config.transfer_queue)" in reports[r.pid]]
    assert len(driver) == 1, [r.where for r in stalls]
    stuck = driver[0]
    assert stuck.after is None and stuck.deadline_s == STALL_S and stuck.waiting_in == "ray.get", stuck
    assert stuck.where is not None and "transfer_queue" in stuck.where["file"], stuck.where
    assert "TaskRunnerV1" in str(stuck.process)  # Ray names the actor's process by its task
    main_ppo = [r for r in stalls if "run_ppo" in reports[r.pid] and r is not stuck]
    assert main_ppo and all(r.waiting_in == "ray.get" and r.began < stuck.began for r in main_ppo), stalls


def test_diagnose_calls_it_hung_with_the_drivers_stall_first_and_hangs_shows_it(run: Path) -> None:
    driver = next(r for r in stall_lines(run) if "tq.init" in (run / str(r.report)).read_text())
    code, text = verl_events_cli("diagnose", str(run), "--json")
    result: dict[str, Any] = json.loads(text)
    assert code == 1 and result["verdict"] == "hung", result
    first = result["first"]
    assert (first["kind"], first["pid"], first["stage"]) == ("stall", driver.pid, None), first
    assert "before its first stage" in first["detail"] and driver.report in first["detail"]
    assert "TaskRunnerV1" in first["detail"]  # the process, named: it has no rank yet
    assert all(f["kind"] == "stall" for f in result["cascade"])
    assert all("waiting for another process's task in ray.get" in f["why"] for f in result["cascade"])
    code, text = verl_events_cli("hangs", str(run))
    assert code == 1 and f"STALL: process {driver.pid}" in text, text
    assert "waiting in ray.get" in text
