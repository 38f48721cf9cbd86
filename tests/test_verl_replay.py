"""Replay on verl 0.9.1's real trainer — ``python -m verl.trainer.main_ppo`` under Ray, FSDP2 on
gloo, CPU — with two FSDP ranks (issue 18, part 2).

Two ranks: ``trainer.n_gpus_per_node=2`` on the one local Ray node the trainer starts (two fake
GPUs; ``num_cpus`` is logical and must hold two ``{CPU: 3, GPU: 1}`` bundles, the task runner,
the agent loop and the reward worker).  The job is verl_events.apps.verl_cpu.job, switched on
with docs/verl.md's one variable, ``VERL_EVENTS_CONFIG``: the sentinel with its default rules
(NaN/inf), msprobe armed by anomalies, and a fault that puts a NaN into rank 1's shard of the
actor's first Linear weight for step 2's ``actor_compute_log_prob`` and its replay only
(``lasts: stage``).  One trainer run, about a minute of ``main_ppo`` on 2 cores.

Is verl's log-prob stage safe to run twice?  ``ActorRolloutRefWorker.compute_log_prob`` and
``compute_ref_log_prob`` (verl/workers/engine_workers.py:696-706) call
``TrainingWorker.infer_batch`` (:398): ``engine.eval_mode()`` (sets and resets ``engine.mode``;
offloads nothing in this job) and ``engine.infer_batch`` under ``torch.no_grad`` — no gradient,
optimizer, RNG or model state changes, and the output is a new TensorDict.  The input TensorDict
is changed in place, but only with keys the replay sets again to the same values
(``tu.assign_non_tensor`` of absent defaults, ``enable_routing_replay``, and in
``FSDPEngine.forward_backward_batch`` (engine/fsdp/transformer_impl.py:724) ``sp_size``,
``batch_num_tokens``, ``dp_size``, computed from the same tensors), with one exception:
``infer_batch`` *pops* ``no_lora_adapter`` (:403).  The trainer sets it only when the
reference model is the LoRA actor with its adapter off (``ref_in_actor``,
trainer/ppo/ray_trainer.py:1273); a replay of that call finds the key gone and runs the actor
with its adapter, so its dump is not of the stage that raised.  This job has a reference model
of its own (no LoRA): the key is never set, and a replay computes exactly what the stage did.
The forward also runs two collectives per call (``all_reduce`` of the token count and of the
loss over the data-parallel group), which is why every rank must replay together.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")

from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.verl_cpu import job
from verl_events.observers.sentinel.record import ReplayRecord

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]

STAGES = ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update")
FAULT = {
    "_target_": "verl_events.apps.inject:WeightFault",
    "kind": "nan",
    "step": 2,
    "stages": ["actor_compute_log_prob"],
    "lasts": "stage",
    "ranks": [1],
}
CONFIG = {
    "observers": [
        {"name": "sentinel"},
        {
            "name": "msprobe",
            "config_path": "statistics_mix",
            "stages": list(STAGES),
            "trigger": "anomaly",
            "capture_steps": 1,
            "max_captures": 2,  # the replay, then the step after the anomaly
        },
        FAULT,
        {"name": "mismatch"},  # with the rollout's log-probs switched off (WITHOUT_ROLLOUT_LOG_PROBS)
    ]
}
TWO_RANKS = [
    "trainer.n_gpus_per_node=2",
    "+ray_kwargs.ray_init.num_gpus=2",
    "ray_kwargs.ray_init.num_cpus=16",
]
# verl 0.9.1 keeps them by default: off, the mismatch observer has nothing to compare.
WITHOUT_ROLLOUT_LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs=False"
# A healthy run takes about a minute; a rank left alone in a collective waits forever.
TIMEOUT_S = 600


@dataclass(frozen=True)
class Run:
    save_path: Path
    code: int
    log: str


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    files = job.prepare(tmp_path_factory.mktemp("replay-job"))
    root = tmp_path_factory.mktemp("replay")
    save_path = root / "profile"
    # JSON is YAML: the file the workers read is the config above, as written.
    (root / "replay.yaml").write_text(json.dumps({"save_path": str(save_path), **CONFIG}, indent=1))
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env = job.trainer_env(base) | {"VERL_EVENTS_CONFIG": str(root / "replay.yaml")}
    overrides = job.merge_overrides(job.trainer_args(files, steps=3), [*TWO_RANKS, WITHOUT_ROLLOUT_LOG_PROBS])
    log = root / "trainer.log"
    started = time.monotonic()
    code = job.run_trainer(overrides, env, log=log, timeout=TIMEOUT_S)
    print(f"main_ppo with two FSDP ranks: exit {code} after {time.monotonic() - started:.0f} s")
    return Run(save_path, code, log.read_text())


def dump_files(save_path: Path) -> list[str]:
    return sorted(str(p.relative_to(save_path)) for p in save_path.rglob("dump.json"))


def replay_records(save_path: Path) -> dict[int, ReplayRecord]:
    lines = (save_path / "replays.jsonl").read_text().splitlines()
    records = [ReplayRecord.from_json(line) for line in lines]
    assert len({r.rank for r in records}) == len(records), lines  # one replay per rank
    return {r.rank: r for r in records}


def test_the_trainer_trains_all_three_steps_and_exits_0(run: Run) -> None:
    # The gloo abort at interpreter exit (verl-cpu-notes.md) can only hit the ranks, Ray
    # workers that Ray ends after the driver has its results: main_ppo's own exit is clean.
    assert run.code == 0, run.log[-6000:]
    assert re.search(r"\bstep:3 - ", run.log), run.log[-6000:]  # verl's console logger, step 3
    assert "'Final validation metrics: None'" in run.log


def test_both_ranks_replay_step_2s_log_probs_and_healthy_step_1_is_not_dumped(run: Run) -> None:
    replay = [f"step_2/actor_compute_log_prob.replay/step0/rank{rank}/dump.json" for rank in (0, 1)]
    # The anomaly arms the next step as before: step 3, every stage, both ranks.
    after = [f"step_3/{stage}/step0/rank{rank}/dump.json" for stage in STAGES for rank in (0, 1)]
    assert dump_files(run.save_path) == sorted(replay + after)
    assert not (run.save_path / "step_1").exists()
    assert "replay of stage" not in run.log  # no replay raised


def test_rank_1s_replay_is_reproducible_and_its_inputs_are_kept(run: Run) -> None:
    records = replay_records(run.save_path)
    assert sorted(records) == [0, 1]
    faulty = records[1]
    assert (faulty.step, faulty.stage, faulty.verdict) == (2, "actor_compute_log_prob", "reproducible"), faulty
    assert "old_log_probs/nonfinite_count" in faulty.again, faulty
    # FSDP2 all-gathers rank 1's shard into rank 0's forward too: rank 0 raised and reproduced it.
    assert records[0].verdict == "reproducible", records[0]
    for rank, record in records.items():
        assert record.inputs == f"step_2/actor_compute_log_prob.replay/inputs_rank{rank}.pt", record
        kept = torch.load(run.save_path / record.inputs, weights_only=True)
        assert "input_ids" in kept and "responses" in kept, sorted(kept)


def test_the_one_off_fault_is_undone_after_the_replay_and_step_3_is_healthy(run: Run) -> None:
    anomalies = [json.loads(line) for line in (run.save_path / "anomalies.jsonl").read_text().splitlines()]
    first = [(a["step"], a["stage"]) for a in anomalies if a["rank"] == 1][0]
    assert first == (2, "actor_compute_log_prob"), anomalies
    # Step 2's update got NaN old log-probs, and verl skips an update whose gradient norm is
    # not finite (engine/fsdp/transformer_impl.py:823); with the weight restored, step 3 is clean.
    assert {a["step"] for a in anomalies} == {2}, anomalies
    assert "the injected fault is undone" in run.log


def test_triage_names_q_proj_in_qwen2s_modeling_file_from_the_replay_dump(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verl_events_main(["triage", str(run.save_path), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    # The first anomaly on file is either rank's (both raise it, and append at once): its replay dump.
    assert result["found"], result
    assert re.search(r"/step_2/actor_compute_log_prob\.replay/step0/rank[01]$", result["dump"]), result
    assert result["replay"]["verdict"] == "reproducible", result
    op = result["op"]
    # The first op reading the NaN is the first Linear's (FSDP's all-gather copies come before
    # the model's own ops and are not the answer).
    assert op["parameter"] == "model.layers.0.self_attn.q_proj.weight", op
    assert op["op"].startswith("Functional.linear."), op
    source = op["source"]
    assert source["file"].endswith("transformers/models/qwen2/modeling_qwen2.py"), op
    assert "q_proj" in source["code"], op


def test_without_the_rollouts_log_probs_mismatch_names_the_setting_for_both_ranks(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [json.loads(line) for line in (run.save_path / "mismatch.jsonl").read_text().splitlines()]
    assert sorted((line["step"], line["rank"]) for line in lines) == [(s, r) for s in (1, 2, 3) for r in (0, 1)]
    assert {line["missing"] for line in lines} == {"the batch carries no rollout_log_probs"}
    assert verl_events_main(["mismatch", str(run.save_path)]) == 2
    error = capsys.readouterr().err
    assert "at step(s) 1, 2, 3" in error and "actor_rollout_ref.rollout.calculate_log_probs=True" in error


def test_a_hung_trainer_is_killed_whole_at_the_timeout(tmp_path: Path) -> None:
    """The timeout the run above relies on: run_trainer's session, a parent and its child, all
    killed by PID (the same code path; a real hang cannot be made on purpose)."""
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(300)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        job._run_in_own_session([sys.executable, "-c", script], dict(os.environ), timeout=5)
    child = int(pid_file.read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
