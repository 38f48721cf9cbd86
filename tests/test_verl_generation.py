"""The rollout seen on verl 0.9.1's default (v1) trainer: ``main_ppo`` under Ray, on CPU, two FSDP
ranks, ``sync`` mode, with the always-on set and a fixed watchdog deadline of 10 s (every healthy
stage here takes under a second), switched on with ``VERL_EVENTS_CONFIG``.

One run of three steps whose agent loop (tests/verl_agents.py, loaded as verl loads a user's) fails
for real in generation: at step 2 one prompt's tool call stalls for 25 s and then returns; at
step 3 every prompt's tool call raises, and verl's replay buffer raises in the driver.  So:

- every step's generation is a stage on the driver's own rank, in ``report``, never under rank 0;
- ``hangs`` names the driver in step 2's ``rollout_generate`` (its deadline passed, then it ended
  late), at verl's line, with the ranks waiting outside it and no rank a suspect;
- ``diagnose`` names the driver's exception in step 3's ``rollout_generate`` and says where the
  rollout's own error is; step 2's stage, which ended after its deadline, is no failure;
- the trainer ranks, idle while the driver is stuck in step 2's generation, pass their stall
  deadline (adaptive here: 30 s the first time after a stage, then 2 x the longest, at least
  5 s): each reports it, and both readers say they waited on the driver, which is no failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")

from verl_events import DRIVER_RANK
from verl_events.apps.verl_cpu import job
from verl_events.observers.timing import TimingRecord, timing_log_path
from verl_events.observers.watchdog import HangRecord
from verl_events.observers.watchdog.record import heartbeat_path, read_heartbeat
from verl_events.observers.watchdog.stall_record import StallRecord, stalls_log_path

from . import support
from .verl_agents import RAISING_STEP, STALL_S, STALLING_STEP, agent_loop_overrides

REPO = Path(__file__).parent.parent
DEADLINE_S = 10.0
TWO_RANKS = ["trainer.n_gpus_per_node=2", "+ray_kwargs.ray_init.num_gpus=2", "ray_kwargs.ray_init.num_cpus=16"]
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generation")
    files = job.prepare(root / "job")
    stall = {"first_s": 30.0, "multiple": 2.0, "floor_s": 5.0}  # first_s, multiple: of the stalls only here
    observers = [{"name": "watchdog", "timeout_s": DEADLINE_S, **stall}]
    config = {"preset": "always_on", "save_path": str(root / "profile"), "observers": observers}
    (root / "observers.yaml").write_text(json.dumps(config))  # JSON is YAML
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env = job.trainer_env(base) | {"VERL_EVENTS_CONFIG": str(root / "observers.yaml"), "PYTHONPATH": str(REPO)}
    overrides = job.merge_overrides(job.trainer_args(files, steps=3), [*TWO_RANKS, *agent_loop_overrides(root)])
    began = time.monotonic()
    code = job.run_trainer(overrides, env, log=root / "trainer.log", timeout=600)
    log = (root / "trainer.log").read_text()
    print(f"main_ppo exited {code} after {time.monotonic() - began:.0f} s")
    assert code != 0, log[-4000:]  # step 3's generation failed
    assert "the search tool refused the connection" in log  # the agent loop's own error, in verl's log
    return root / "profile"


def verl_events_cli(*args: str) -> tuple[int, str]:
    result = subprocess.run([support.verl_events_exe(), *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stdout


def test_each_steps_generation_is_a_stage_of_the_driver_never_of_rank_0(run: Path) -> None:
    driver = [TimingRecord.from_json(line) for line in timing_log_path(run, DRIVER_RANK).read_text().splitlines()]
    assert [(r.stage, r.step, r.rank, r.error) for r in driver] == [
        ("rollout_generate", 1, DRIVER_RANK, None),
        ("rollout_generate", 2, DRIVER_RANK, None),
        ("rollout_generate", 3, DRIVER_RANK, "RuntimeError"),
    ]
    assert driver[1].elapsed_s >= STALL_S > driver[0].elapsed_s  # the stalled tool call is in its time
    for rank in (0, 1):
        stages = {TimingRecord.from_json(line).stage for line in timing_log_path(run, rank).read_text().splitlines()}
        assert "rollout_generate" not in stages and "actor_update" in stages, stages
    beat = read_heartbeat(heartbeat_path(run, DRIVER_RANK))
    assert beat.rank == DRIVER_RANK and beat.pid != read_heartbeat(heartbeat_path(run, 0)).pid
    code, text = verl_events_cli("report", str(run))
    assert code == 0 and ": 2 ranks and the driver, " in text, text
    assert "rollout_generate" in text and "driver" in text


def test_hangs_names_the_driver_stuck_in_step_2s_generation_and_the_ranks_waiting_outside(run: Path) -> None:
    records = [HangRecord.from_json(line) for line in (run / "hangs.jsonl").read_text().splitlines()]
    assert [(r.kind, r.stage, r.step, r.rank) for r in records] == [
        ("hang", "rollout_generate", STALLING_STEP, DRIVER_RANK),
        ("late", "rollout_generate", STALLING_STEP, DRIVER_RANK),
    ]
    assert records[0].where is not None and records[0].where["file"].endswith("replay_buffer.py")
    code, text = verl_events_cli("hangs", str(run), "--json")
    result: dict[str, Any] = json.loads(text)
    assert code == 1 and result["stuck"] == {"step": STALLING_STEP, "stage": "rollout_generate"}
    states = {(r["name"], r["state"]) for r in result["ranks"]}
    assert states == {("driver", "finished"), ("rank 0", "elsewhere"), ("rank 1", "elsewhere")}, states
    assert result["suspect"]["ranks"] == []  # the ranks wait for the driver; the driver finished, late
    code, text = verl_events_cli("hangs", str(run))
    assert "on the driver" in text and "waiting outside it (it is the driver's): 2" in text, text


def test_diagnose_names_the_drivers_exception_in_step_3s_generation_and_where_the_rollouts_error_is(
    run: Path,
) -> None:
    code, text = verl_events_cli("diagnose", str(run), "--json")
    result: dict[str, Any] = json.loads(text)
    first = result["first"]
    assert code == 1 and result["verdict"] == "failed", result
    assert (first["rank"], first["step"], first["stage"], first["kind"]) == (
        DRIVER_RANK,
        RAISING_STEP,
        "rollout_generate",
        "exception",
    )
    assert "no materializable trajectories" in first["detail"]  # verl's own words for it
    cascade = result["cascade"]
    assert [(f["rank"], f["kind"]) for f in cascade if f["kind"] != "signal"] == [(-2, "exception")]  # main_ppo
    stopped = {f["rank"]: f["why"] for f in cascade if f["kind"] == "signal"}
    assert stopped.keys() <= {DRIVER_RANK, 0, 1} and all("launcher" in stopped[rank] for rank in stopped.keys() - {-1})
    code, text = verl_events_cli("diagnose", str(run))
    assert "the driver (where verl's trainer loop runs)" in text and "'Error in _run_prompt'" in text, text


def test_the_ranks_idle_while_the_driver_is_stuck_in_generation_waited_on_it_and_nothing_else_stalled(
    run: Path,
) -> None:
    lines = [StallRecord.from_json(line) for line in stalls_log_path(run).read_text().splitlines()]
    stalls = [r for r in lines if r.kind == "stall"]
    assert sorted(r.ranks[0] for r in stalls if r.ranks) == [0, 1], stalls  # each trainer rank, once
    driver = [TimingRecord.from_json(line) for line in timing_log_path(run, DRIVER_RANK).read_text().splitlines()]
    generation = next(r for r in driver if r.step == STALLING_STEP)
    for record in stalls:  # while the driver was inside step 2's generation
        assert generation.end_unix - generation.elapsed_s < record.time < generation.end_unix, record
        assert record.after is not None and record.report is not None
    assert sorted(r.ranks[0] for r in lines if r.kind == "resumed") == [0, 1]  # step 2's training began
    code, text = verl_events_cli("hangs", str(run), "--json")
    result: dict[str, Any] = json.loads(text)
    assert [(s["state"], s["waiting_on"]) for s in result["stalls"]] == [
        ("waiting", f"driver was inside rollout_generate (step {STALLING_STEP})")
    ] * 2
    code, text = verl_events_cli("diagnose", str(run), "--json")
    failures = [json.loads(text)["first"], *json.loads(text)["cascade"]]
    assert not [f for f in failures if f["source"] == "stalls.jsonl"]  # waiting is no failure
