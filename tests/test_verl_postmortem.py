"""``verl-events diagnose`` on verl 0.9.1's real trainer — ``python -m verl.trainer.main_ppo`` under
Ray, FSDP2 on gloo, on CPU, two FSDP ranks (``trainer.n_gpus_per_node=2``) — with the always-on
set switched on through ``VERL_EVENTS_CONFIG`` (docs/postmortem.md).

Three trainer runs of two steps each (step 1 healthy, the failure in step 2), about a minute or
two each on 2 cores:

- **killed**: rank 1's process SIGKILLs itself as step 2's ``actor_update`` begins
  (tests.support:Killer); the driver fails with Ray's ``ActorDiedError``, which names no rank.
  Diagnose must name rank 1, step 2, the stage and ``killed``, say it was killed as the stage
  began, and name the other rank as cascade.
- **killed later**: the same, 3 s into the stage, after beats from inside it: placed in the same
  stage, with how far into it, and never "as the stage began".
- **raised**: a forward hook on rank 0's actor model raises inside step 2's update
  (tests.support:Raiser); the driver fails with Ray's ``RayTaskError``.  Diagnose must name
  rank 0, the stage (``train_batch``, verl's mini-batch stage nested in ``actor_update``), the
  message and the hook's ``raise`` line in tests/support.py.

That a healthy run comes out healthy is asserted on tests/test_verl_trainer.py's 12 healthy
steps, which the watchdog watches too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")

from verl_events.apps.verl_cpu import job

from . import support

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]

TWO_RANKS = ["trainer.n_gpus_per_node=2", "+ray_kwargs.ray_init.num_gpus=2", "ray_kwargs.ray_init.num_cpus=16"]
# Two steps take about a minute; a rank left alone in a collective would wait forever.
TIMEOUT_S = 600
MESSAGE = "the actor's forward raised on purpose (tests.support:Raiser)"


@dataclass(frozen=True)
class Run:
    save_path: Path
    code: int
    log: str


def run_with(root: Path, fault: dict[str, Any]) -> Run:
    """The tiny job on two FSDP ranks for two steps, the always-on set and ``fault`` switched on
    with ``VERL_EVENTS_CONFIG``."""
    files = job.prepare(root / "job")
    save_path = root / "profile"
    config = {"preset": "always_on", "save_path": str(save_path), "observers": [fault]}
    (root / "observers.yaml").write_text(json.dumps(config, indent=1))  # JSON is YAML
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env = job.trainer_env(base) | {"VERL_EVENTS_CONFIG": str(root / "observers.yaml"), "PYTHONPATH": str(support.REPO)}
    overrides = job.merge_overrides(job.trainer_args(files, steps=2), TWO_RANKS)
    log = root / "trainer.log"
    started = time.monotonic()
    code = job.run_trainer(overrides, env, log=log, timeout=TIMEOUT_S)
    print(f"main_ppo with two FSDP ranks, {fault['_target_']}: exit {code} after {time.monotonic() - started:.0f} s")
    return Run(save_path, code, log.read_text())


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Run:
    # Killed as the stage begins (where OOM kills land: the stage reloads offloaded state first),
    # within the heartbeat's interval of the boundary: the stage-boundary record places it.
    fault = {"_target_": "tests.support:Killer", "step": 2, "rank": 1, "seconds": 0, "stages": ["actor_update"]}
    return run_with(tmp_path_factory.mktemp("killed"), fault)


@pytest.fixture(scope="module")
def killed_later(tmp_path_factory: pytest.TempPathFactory) -> Run:
    fault = {"_target_": "tests.support:Killer", "step": 2, "rank": 1, "seconds": 3, "stages": ["actor_update"]}
    return run_with(tmp_path_factory.mktemp("killed_later"), fault)


@pytest.fixture(scope="module")
def raised(tmp_path_factory: pytest.TempPathFactory) -> Run:
    fault = {"_target_": "tests.support:Raiser", "step": 2, "rank": 0, "message": MESSAGE, "stages": ["actor_update"]}
    return run_with(tmp_path_factory.mktemp("raised"), fault)


def diagnose(run: Run) -> tuple[int, dict[str, Any], str]:
    """``verl-events diagnose`` on the run's save_path, as JSON and as text (printed)."""
    exe = support.verl_events_exe()
    as_json = subprocess.run([exe, "diagnose", str(run.save_path), "--json"], capture_output=True, text=True)
    text = subprocess.run([exe, "diagnose", str(run.save_path)], capture_output=True, text=True)
    assert as_json.returncode == text.returncode, text.stderr
    print(text.stdout)
    return as_json.returncode, json.loads(as_json.stdout), text.stdout


def step_1_trained_and_step_2_did_not(run: Run) -> None:
    steps = {int(s) for s in re.findall(r"\bstep:(\d+) - ", run.log)}  # verl's console logger
    assert steps == {1}, run.log[-6000:]


def assert_the_rest_follows(result: dict[str, Any], first_rank: int, cause: str) -> None:
    """The other rank is in the cascade as following ``cause`` (diagnose's words: "rank 1's
    death"), and nothing in the cascade happened before the first failure."""
    first = result["first"]
    other = [item for item in result["cascade"] if item["rank"] == 1 - first_rank]
    assert other and any(cause in item["why"] for item in other), result
    for item in result["cascade"]:
        assert item["time"] >= first["time"], result


def test_a_rank_killed_in_step_2s_update_fails_the_job_with_rays_actor_died_error(killed: Run) -> None:
    assert killed.code != 0, killed.log[-6000:]
    assert "ActorDiedError" in killed.log, killed.log[-6000:]
    step_1_trained_and_step_2_did_not(killed)


def test_diagnose_names_the_killed_rank_its_step_and_stage_and_the_rest_is_cascade(killed: Run) -> None:
    code, result, text = diagnose(killed)
    assert code == 1 and result["verdict"] == "failed", text
    first = result["first"]
    assert (first["rank"], first["step"], first["stage"], first["kind"]) == (1, 2, "actor_update", "killed"), text
    assert "is gone" in first["detail"] and first["pid"] is not None and first["host"] is not None, text
    # Read from rank 1's own heartbeat, not from the driver's ActorDiedError.
    assert first["source"] == "heartbeats/rank1.json", text
    assert "killed as the stage began (within " in first["detail"], text
    assert_the_rest_follows(result, 1, "rank 1's death")


def test_a_rank_killed_3_s_into_step_2s_update_is_placed_in_it_with_how_far_in(killed_later: Run) -> None:
    assert killed_later.code != 0 and "ActorDiedError" in killed_later.log, killed_later.log[-6000:]
    code, result, text = diagnose(killed_later)
    first = result["first"]
    assert (first["rank"], first["step"], first["stage"], first["kind"]) == (1, 2, "actor_update", "killed"), text
    assert "s into the stage, at " in first["detail"] and "as the stage began" not in first["detail"], text
    assert_the_rest_follows(result, 1, "rank 1's death")


def test_a_forward_that_raises_in_step_2s_update_fails_the_job_with_rays_task_error(raised: Run) -> None:
    assert raised.code != 0, raised.log[-6000:]
    assert "RayTaskError" in raised.log and MESSAGE in raised.log, raised.log[-6000:]
    step_1_trained_and_step_2_did_not(raised)


def test_diagnose_names_the_raising_rank_the_stage_the_message_and_the_line(raised: Run) -> None:
    code, result, text = diagnose(raised)
    assert code == 1 and result["verdict"] == "failed", text
    first = result["first"]
    assert (first["rank"], first["step"], first["kind"]) == (0, 2, "exception"), text
    # The forward runs in verl's mini-batch stage, nested in actor_update: the innermost stage.
    assert first["stage"] == "train_batch", text
    assert first["detail"] == f"RuntimeError: {MESSAGE}", text
    raise_line = next(
        n
        for n, line in enumerate(Path(support.__file__).read_text().splitlines(), 1)
        if "raise RuntimeError(self" in line
    )
    assert (first["where"]["file"], first["where"]["line"]) == (support.__file__, raise_line), text
    assert f"{support.__file__}:{raise_line}" in text
    assert first["source"] == "crashes/rank0.jsonl", text  # rank 0's own record, not the driver's RayTaskError
    assert_the_rest_follows(result, 0, "rank 0's exception")
