"""The watchdog in verl 0.9.1's real trainer (``main_ppo`` under Ray, on CPU), switched on with
``VERL_EVENTS_CONFIG`` as docs/verl.md says: a worker stuck in step 2's ``actor_update`` is
reported with its line, and ``action: abort`` ends the job, which ``diagnose`` calls hung.
This run is verl's default trainer in its ``colocate_async`` mode (the trainer tests' one run
of it: rollouts of the next step are generated while this one trains), so the mismatch observer
watching it says each step's rollout was sampled with older weights than the trainer's.  That
healthy steps pass no deadline is shown on tests/test_verl_trainer.py's 12 healthy steps, which
the watchdog watches too."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")

from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.verl_cpu import job
from verl_events.observers.mismatch import MismatchRecord
from verl_events.observers.watchdog import ABORT_EXIT_CODE, HangRecord

from . import support

REPO = Path(__file__).parent.parent
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]


def run(root: Path, observers: list[dict[str, object]], steps: int, timeout: float) -> int:
    files = job.prepare(root / "job")
    config = {"save_path": str(root / "profile"), "observers": observers}
    (root / "observers.yaml").write_text(json.dumps(config))  # JSON is YAML
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env = job.trainer_env(base) | {"VERL_EVENTS_CONFIG": str(root / "observers.yaml"), "PYTHONPATH": str(REPO)}
    overrides = job.trainer_args(files, steps=steps, mode="colocate_async")
    return job.run_trainer(overrides, env, log=root / "trainer.log", timeout=timeout)


def test_a_worker_stuck_in_step_2s_update_is_reported_with_its_line_and_abort_ends_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deadline = 20.0
    observers = [
        {"name": "watchdog", "timeout_s": deadline, "action": "abort", "stages": ["actor_update"]},
        {"_target_": "tests.support:Sleeper", "step": 2, "seconds": 600, "stages": ["actor_update"]},
        {"name": "mismatch"},
    ]
    began = time.monotonic()
    code = run(tmp_path, observers, steps=3, timeout=600)
    took = time.monotonic() - began
    log = (tmp_path / "trainer.log").read_text()
    assert code != 0 and took < 400, log[-6000:]  # not the sleeper's 600 s
    (hung,) = [HangRecord.from_json(line) for line in (tmp_path / "profile/hangs.jsonl").read_text().splitlines()]
    assert (hung.kind, hung.stage, hung.step, hung.rank, hung.action) == ("hang", "actor_update", 2, 0, "abort")
    assert hung.where is not None and hung.where["file"] == support.__file__ and "time.sleep" in hung.where["code"]
    assert verl_events_main(["hangs", str(tmp_path / "profile"), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["stuck"] == {"step": 2, "stage": "actor_update"}
    # The watchdog ended the rank and said so: the run hung, whatever died after.
    assert verl_events_main(["diagnose", str(tmp_path / "profile"), "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    first = verdict["first"]
    assert verdict["verdict"] == "hung" and (first["rank"], first["kind"], first["step"]) == (0, "hang", 2), verdict
    assert all(f["kind"] != "killed" for f in verdict["cascade"]), verdict["cascade"]
    print(f"main_ppo exited {code} after {took:.0f} s; its log's last lines:\n{log[-2500:]}")
    assert str(ABORT_EXIT_CODE) in log or "died" in log.lower()
    # Step 2's responses were sampled while step 1 trained, with the weights of sync 0; the
    # trainer's are version 1 (verl's reckoning: step - 1).
    lines = [MismatchRecord.from_json(line) for line in (tmp_path / "profile/mismatch.jsonl").read_text().splitlines()]
    weights = {line.step: line.weights for line in lines}
    assert sorted(weights) == [1, 2], lines
    assert weights[2] is not None and weights[2]["trainer"] == 1 and weights[2]["rollout_max"] == 0, weights
    assert "trainer_mode': 'colocate_async'" in log  # verl printed the config it ran
