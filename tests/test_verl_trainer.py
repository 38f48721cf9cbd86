"""verl 0.9.1's real trainer — ``python -m verl.trainer.main_ppo`` under Ray, FSDP2 on gloo,
on CPU — with the switches exactly as docs/verl.md writes them.

The job is verl_events.apps.verl_cpu.job: a tiny random Qwen2 model, an offline byte-level BPE
tokenizer, a 32-row parquet, a custom reward, 3 steps, repeatable (reinforce_plus_plus,
rollout.n=1, seeded).  docs/verl.md's YAML is the config and its commands are run as
written, with ``/shared/`` pointing into a temporary directory and ``...your usual
arguments...`` standing for the job's own arguments.  Three trainer runs, about 40 s each.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")

from verl_events import DRIVER_RANK
from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.verl_cpu import job
from verl_events.apps.verl_cpu.engine_options import ROLLOUT_ENGINES
from verl_events.observers.checkpoint.record import CheckpointRecord, checkpoint_log_path, manifest_path
from verl_events.observers.memory.record import MemoryRecord, memory_log_path
from verl_events.observers.weight_sync.record import SyncRecord, weight_sync_log_path

from .support import REPO, DocCommand, doc_blocks, doc_commands, on, read_margins, tensorboard_scalars

SENTINEL_DOC = (REPO / "docs/sentinel.md").read_text()
STAGES = ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update")
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]


def run_doc_command(
    command: DocCommand,
    root: Path,
    files: job.JobFiles,
    name: str,
    *,
    steps: int = 3,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
    legacy: bool = False,
) -> Path:
    """Run one of the doc's main_ppo commands on the tiny job (``env`` added to its
    environment, ``extra`` to its arguments; verl's v0 trainer when ``legacy``); return its
    save_path root."""
    assert command.argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"], command.argv
    doc_args = [on(root, arg) for arg in command.argv[3:]]
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    env = job.trainer_env(base) | {k: on(root, v) for k, v in command.env.items()} | (env or {})
    overrides = job.merge_overrides(job.trainer_args(files, steps=steps, legacy=legacy), [*doc_args, *extra])
    log = root / f"{name}.log"
    code = job.run_trainer(overrides, env, log=log)
    assert code == 0, f"{name}: main_ppo exited {code}:\n{log.read_text()[-6000:]}"
    return root


def write_doc_config(root: Path) -> None:
    """docs/verl.md's observers.yaml and the msprobe config it names, under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    config = next(b for b in doc_blocks("yaml") if "global_profiler:" in b)
    (root / "observers.yaml").write_text(on(root, config))
    shutil.copy(REPO / "verl_events/observers/msprobe/configs/statistics_L1.json", root / "dump_config.json")


@dataclass(frozen=True)
class Runs:
    plugin: Path  # the one-variable switch; also holds verl's own run (verl-profile/)
    hook: Path  # the setup-hook switch with verl's plugins off, on verl's legacy (v0) trainer


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    files = job.prepare(tmp_path_factory.mktemp("job"))
    plugin, hook = tmp_path_factory.mktemp("plugin"), tmp_path_factory.mktemp("hook")
    for root in (plugin, hook):
        write_doc_config(root)
    # The plugin run also checks every weight sync (the healthy control of
    # tests/test_verl_weight_sync.py) and records every stage's memory.
    config = yaml.safe_load((plugin / "observers.yaml").read_text())
    config["observers"] += [
        {"name": "weight_sync", "canary": True, **ROLLOUT_ENGINES["weight_sync"]},
        {"name": "memory"},
    ]
    (plugin / "observers.yaml").write_text(yaml.safe_dump(config))
    (switch,) = doc_commands("VERL_EVENTS_CONFIG=/shared/observers.yaml", without="+ray_kwargs")
    # This run also saves a checkpoint every step, for its transition stages, in a folder of its
    # own: verl resumes from what it finds in the default one (resume_mode: auto).
    saves = ("trainer.save_freq=1", f"trainer.default_local_dir={plugin / 'checkpoints'}")
    run_doc_command(switch, plugin, files, "ours", extra=saves)
    run_doc_command(doc_commands("precision_debugger")[0], plugin, files, "verls")
    # The one run of verl's deprecated v0 trainer: the comparison with the default (v1) one. It
    # saves every step too, with the checkpoint observer on (docs/checkpoints.md: v0 is watched).
    config = yaml.safe_load((hook / "observers.yaml").read_text())
    config["observers"] += [{"name": "checkpoint"}]
    (hook / "observers.yaml").write_text(yaml.safe_dump(config))
    v0_saves = ("trainer.save_freq=1", f"trainer.default_local_dir={hook / 'checkpoints'}")
    run_doc_command(doc_commands("worker_process_setup_hook")[0], hook, files, "hook", legacy=True, extra=v0_saves)
    return Runs(plugin, hook)


def dump_files(save_path: Path) -> list[str]:
    return sorted(str(p.relative_to(save_path)) for p in save_path.rglob("dump.json"))


GUIDE_TREE = sorted(f"step_{step}/{stage}/step0/rank0/dump.json" for step in (1, 2) for stage in STAGES)


def entries(dump: Path) -> list[str]:
    return sorted(json.loads(dump.read_text())["data"])


def test_the_one_variable_switch_dumps_the_guides_tree_for_steps_1_and_2_only(runs: Runs) -> None:
    assert dump_files(runs.plugin / "profile") == GUIDE_TREE
    assert json.loads((runs.plugin / "profile/run.json").read_text())["run_id"].startswith("ray-")


def rank0_timing(save_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (save_path / "timing/rank0.jsonl").read_text().splitlines()]


def test_every_timing_record_of_every_step_has_the_trainers_step(runs: Runs) -> None:
    records = rank0_timing(runs.plugin / "profile")
    steps = {stage: [r["step"] for r in records if r["stage"] == stage] for stage in (*STAGES, "train_batch")}
    assert steps == {
        "actor_compute_log_prob": [1, 2, 3],
        "ref_compute_log_prob": [1, 2, 3],
        "actor_update": [1, 2, 3],
        "train_batch": [1, 1, 2, 2, 3, 3],  # verl's nested stage, once per mini-batch
    }
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)
    profiled = {(r["stage"], r["step"]) for r in records if "msprobe" in r["profiled_by"]}
    assert profiled == {(stage, step) for stage in STAGES for step in (1, 2)}
    nested = {r["step"]: r["enclosed_by"] for r in records if r["stage"] == "train_batch"}
    assert nested == {1: ["msprobe"], 2: ["msprobe"], 3: []}


TRANSITIONS = ("save_checkpoint", "update_weights", "rollout_wake_up")


def test_every_transition_stage_is_timed_every_step_with_its_step(runs: Runs) -> None:
    """verl's weight sync, the rollout's wake-up inside it and the checkpoint save, each a stage
    in the trainer's worker, with the step whose weights they move (the sync before step 1 sends
    step 0's; the sync wakes the rollout's weights, then its KV cache)."""
    save_path = runs.plugin / "profile"
    logs = (save_path / "timing").glob("rank*.jsonl")
    records = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    steps = {stage: sorted(r["step"] for r in records if r["stage"] == stage) for stage in TRANSITIONS}
    assert steps == {
        "save_checkpoint": [1, 2, 3],
        "update_weights": [0, 1, 2, 3],
        "rollout_wake_up": [0, 0, 1, 1, 2, 2, 3, 3],
    }
    wake_ups = [r for r in records if r["stage"] == "rollout_wake_up"]
    assert all(r["role"] == "rollout" and r["rank"] == 0 for r in wake_ups), wake_ups
    # The driver's wait for each step's generation, on its own rank; its memory too.
    generation = [(r["step"], r["rank"]) for r in records if r["stage"] == "rollout_generate"]
    assert generation == [(1, DRIVER_RANK), (2, DRIVER_RANK), (3, DRIVER_RANK)], generation
    memory = [MemoryRecord.from_json(line) for line in memory_log_path(save_path, DRIVER_RANK).read_text().splitlines()]
    assert [(m.stage, m.step) for m in memory] == [("rollout_generate", step) for step in (1, 2, 3)]
    # verl saved what the stages say it saved.
    assert sorted(p.name for p in (runs.plugin / "checkpoints").glob("global_step_*")) == [
        f"global_step_{step}" for step in steps["save_checkpoint"]
    ]


def test_every_healthy_sync_is_in_the_ledger_with_the_engines_receipt_and_no_alarm(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control for the weight_sync observer's alarms: verl's healthy run, every sync
    (step 0's starting weights, then one after each step) sent, received and held, and the
    canary's forward on both sides within its tolerances: no alarm."""
    save_path = runs.plugin / "profile"
    lines = weight_sync_log_path(save_path).read_text().splitlines()
    records = [SyncRecord.from_json(line) for line in lines]
    assert [(r.step, r.rank, r.optimizer_stepped) for r in records] == [
        (0, 0, False),
        (1, 0, True),
        (2, 0, True),
        (3, 0, True),
    ]
    assert all(r.alarms == [] and r.nonfinite == [] for r in records), [r.alarms for r in records]
    for record in records:
        assert record.receipt is not None, record
        assert (record.receipt["compared"], record.receipt["same_dtype"]) == (record.tensors, True), record
        # The canary at every sync: the first is the baseline, the others within its tolerances.
        assert record.canary is not None and record.canary["first_layer"] is None, record
    assert [r.canary["tolerance"] is None for r in records if r.canary] == [True, False, False, False]
    # An optimizer step changes every tensor it sends (a tied lm_head included).
    assert [r.changed for r in records] == [None, *(r.tensors for r in records[1:])]
    assert verl_events_main(["weights", str(save_path)]) == 0
    assert "4 sync(s) on 1 rank(s), steps 0-3; no alarms" in capsys.readouterr().out


def test_every_stage_of_every_step_has_its_memory_the_transitions_included(runs: Runs) -> None:
    """The memory observer in verl's worker: one record per stage the timing log has, with the
    same steps, and host figures that are the worker's own (a Python process with torch and a
    model holds more than 100 MB; its peak is at least what it held at either end)."""
    save_path = runs.plugin / "profile"
    timed = [json.loads(line) for line in (save_path / "timing/rank0.jsonl").read_text().splitlines()]
    memory = [MemoryRecord.from_json(line) for line in memory_log_path(save_path, 0).read_text().splitlines()]
    assert sorted((r.stage, r.step) for r in memory) == sorted((r["stage"], r["step"]) for r in timed)
    stages = {r.stage for r in memory}
    assert {*STAGES, *TRANSITIONS} <= stages
    for record in memory:
        assert record.host_peak == "reset" and record.host_begin_bytes and record.host_end_bytes, record
        assert record.host_begin_bytes > 100 * 2**20, record
        assert record.host_peak_bytes >= max(record.host_begin_bytes, record.host_end_bytes), record
        assert record.device is None  # no device on this machine
    # The forecast read each step's tokens from verl's own batch, and on this healthy run never warned.
    assert [r for r in memory if r.forecast is not None] == []
    updates = [r for r in memory if r.stage == "actor_update"]
    assert updates and all(isinstance(r.tokens, int) and r.tokens > 0 for r in updates), updates
    by_step: dict[int | None, set[int]] = {}
    for record in memory:
        if record.tokens is not None:
            by_step.setdefault(record.step, set()).add(record.tokens)
    assert all(len(tokens) == 1 for tokens in by_step.values()), by_step  # one count per step


def test_report_reads_the_run(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    assert verl_events_main(["report", str(runs.plugin / "profile"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(row["stage"], row["step"]): row for row in report["stage_steps"]}
    assert rows[("actor_update", 1)]["profiled_by"] == ["msprobe"]
    assert rows[("actor_update", 3)]["profiled_by"] == [] and rows[("actor_update", 1)]["ratio"] > 0
    assert rows[("train_batch", 1)]["profiled_by"] == ["msprobe (around)"]


def test_verls_own_precision_debugger_writes_the_same_files_with_the_same_entries(runs: Runs) -> None:
    ours, verls = runs.plugin / "profile", runs.plugin / "verl-profile"
    assert dump_files(verls) == GUIDE_TREE
    for name in GUIDE_TREE:
        assert entries(ours / name) == entries(verls / name), name


def test_compare_as_documented_says_match_for_every_stage_dump(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    (compare,) = [c for c in doc_commands("precision_debugger") if c.argv[0] == "verl-events"]
    assert compare.argv[1] == "compare"
    argv = [on(runs.plugin, arg) for arg in compare.argv[1:]]
    for step in (1, 2):
        for stage in STAGES:
            argv[argv.index("--step") + 1], argv[argv.index("--stage") + 1] = str(step), stage
            assert verl_events_main(argv) == 0, capsys.readouterr().out
            assert "MATCH" in capsys.readouterr().out


def model_ops(dump: Path) -> Counter[str]:
    """The dump's module and functional entries, counted without msprobe's call numbers: the
    model's own ops, not the tensor work a worker does on its batch around them."""
    names = (re.sub(r"\.\d+\.", ".", name) for name in entries(dump))
    return Counter(name for name in names if not name.startswith("Tensor."))


def stage_steps(save_path: Path, *, without: tuple[str, ...] = ()) -> list[tuple[str, int, list[str]]]:
    return [(r["stage"], r["step"], r["enclosed_by"]) for r in rank0_timing(save_path) if r["stage"] not in without]


def test_the_setup_hook_switch_alone_on_verls_legacy_trainer_dumps_the_same_stages_and_model_ops(runs: Runs) -> None:
    """The setup hook with verl's plugins off, on verl's deprecated v0 trainer: the same dump
    tree, the same stages of the same steps in the same order, and the same model ops in every
    dump as on the default trainer. Only the worker's tensor work on its batch differs (v1's
    engine builds position ids from jagged rows: more ``cumsum``)."""
    legacy, default = runs.hook / "profile", runs.plugin / "profile"
    assert dump_files(legacy) == GUIDE_TREE
    for name in GUIDE_TREE:
        assert model_ops(legacy / name) == model_ops(default / name), name
    # Both saved a checkpoint every step.
    assert stage_steps(legacy) == stage_steps(default)
    # verl's plugins were off in that run: the hook alone installed the observers.
    assert doc_commands("worker_process_setup_hook")[0].env == {"VERL_USE_EXTERNAL_PLUGINS": "none"}
    assert "main_ppo_v0" in (runs.hook / "hook.log").read_text()  # the legacy trainer ran


def test_the_checkpoint_observer_on_verls_legacy_trainer_keeps_every_save_and_the_loops_end(runs: Runs) -> None:
    """v0 keeps working: its workers' saves have their manifests, and its driver's loop its end
    (the default trainer's resumes: tests/test_verl_checkpoints.py)."""
    lines = checkpoint_log_path(runs.hook / "profile").read_text().splitlines()
    records = [CheckpointRecord.from_json(line) for line in lines]
    saved = [(r.step, r.rank, r.alarms) for r in records if r.kind == "saved"]
    assert saved == [(step, 0, []) for step in (1, 2, 3)], records
    assert all(manifest_path(runs.hook / "checkpoints" / f"global_step_{s}" / "actor", 0).is_file() for s in (1, 2, 3))
    (loop,) = [r for r in records if r.kind == "loop_ended"]
    assert (loop.resumed_from, loop.total_steps, loop.last_step, loop.alarms) == (None, 3, 3, [])


# -- the anomaly sentinel on verl's trainer ------------------------------------------


def test_verls_trainer_runs_healthy_steps_without_an_anomaly_or_a_passed_deadline(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/sentinel.md's verl config and switch on 12 healthy steps (a fifth trainer run): no anomaly,
    no dump, and the example rule's gradient norm judged at the update and at each of its
    mini-batches (``train_batch``, two a step).  Prints the margins (docs/sentinel.md's table);
    tests/support.py's observer writes them in the workers, where the sentinel is never closed.
    The watchdog watches the same run (its adaptive deadlines, floor 30 s): no deadline passes;
    and the mismatch observer, on the job's default precisions."""
    files = job.prepare(tmp_path_factory.mktemp("healthy-job"))
    root = tmp_path_factory.mktemp("healthy")
    config = next(b for b in doc_blocks("yaml", SENTINEL_DOC) if "# /shared/sentinel.yaml" in b)
    shutil.copy(REPO / "verl_events/observers/msprobe/configs/statistics_mix.json", root / "statistics_mix.json")
    margins_file = {"_target_": "tests.support:SentinelMarginsFile", "folder": "/shared/margins"}
    watchdog = {"name": "watchdog", "floor_s": 30, "first_s": 300}
    extra = "".join(f"  - {json.dumps(entry)}\n" for entry in (margins_file, watchdog, {"name": "mismatch"}))
    (root / "sentinel.yaml").write_text(on(root, config + extra))
    switch, _ = doc_commands("sentinel.yaml", doc=SENTINEL_DOC)
    run_doc_command(switch, root, files, "healthy", steps=12, env={"PYTHONPATH": str(REPO)})

    save_path = root / "profile"
    assert not (save_path / "anomalies.jsonl").exists(), (save_path / "anomalies.jsonl").read_text()
    assert dump_files(save_path) == []
    found = [m for m in read_margins(root / "margins") if m.metric == "actor/grad_norm"]
    for margin in found:
        print(f"verl: {margin.describe()}")
    # Judged from step 5 to 12: once a step at the update, at each of its two mini-batches.
    assert [(m.stage, m.judged) for m in found] == [("actor_update", 8), ("train_batch", 16)]
    assert not (save_path / "hangs.jsonl").exists()
    assert not (save_path / "stalls.jsonl").exists()  # 12 healthy steps: no stall, first step included
    assert verl_events_main(["hangs", str(save_path)]) == 0
    assert "no deadline passed" in capsys.readouterr().out
    # The mismatch observer watched too: verl 0.9.1 keeps the rollout's log-probs by default
    # (rollout.calculate_log_probs: True), and this job's trainer runs FSDP's default bfloat16
    # parameters against a float32 rollout (docs/mismatch.md).
    assert verl_events_main(["mismatch", str(save_path), "--json"]) == 0
    trend = json.loads(capsys.readouterr().out)["trend"]
    assert [row["step"] for row in trend] == list(range(1, 13))
    # How the run ended (docs/postmortem.md): no rank raised, was signalled or stopped beating; Ray's
    # SIGTERM to the workers once the driver ended normally is teardown.
    assert verl_events_main(["diagnose", str(save_path), "--json"]) == 0
    diagnosis = json.loads(capsys.readouterr().out)
    assert (diagnosis["verdict"], diagnosis["first"], diagnosis["cascade"]) == ("healthy", None, []), diagnosis
    assert diagnosis["teardown"] and all(t["kind"] in ("signal", "killed") for t in diagnosis["teardown"]), diagnosis
    print("verl, bf16 trainer against a float32 rollout: mean |Δ log p| per step", [f"{r['mean']:.3g}" for r in trend])


def test_the_sentinel_catches_a_nan_in_the_actor_and_msprobe_dumps_the_next_step_only(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/sentinel.md's verl config and commands, plus an observer that puts a NaN into the
    actor's weights at the start of step 2's update (a fourth trainer run), and the tracker,
    which sends every step's stage times and the anomalies to TensorBoard from the worker."""
    files = job.prepare(tmp_path_factory.mktemp("sentinel-job"))
    root = tmp_path_factory.mktemp("sentinel")
    config = next(b for b in doc_blocks("yaml", SENTINEL_DOC) if "# /shared/sentinel.yaml" in b)
    shutil.copy(REPO / "verl_events/observers/msprobe/configs/statistics_mix.json", root / "statistics_mix.json")
    fault = {"_target_": "verl_events.apps.inject:WeightFault", "kind": "nan", "step": 2, "stages": ["actor_update"]}
    tracker = {"name": "tracker", "backends": ["tensorboard"]}
    extra = "".join(f"  - {json.dumps(entry)}\n" for entry in (fault, tracker))
    (root / "sentinel.yaml").write_text(on(root, config) + extra)
    switch, triage = doc_commands("sentinel.yaml", doc=SENTINEL_DOC)
    run_doc_command(switch, root, files, "sentinel")

    save_path = root / "profile"
    anomalies = [json.loads(line) for line in (save_path / "anomalies.jsonl").read_text().splitlines()]
    first_step = min(a["step"] for a in anomalies)
    fired = {a["metric"]: a for a in anomalies if a["step"] == first_step}
    # The update's first mini-batch (train_batch, nested in actor_update) reports it first.
    assert first_step == 2 and fired["actor/grad_norm"]["stage"] in ("train_batch", "actor_update"), anomalies
    assert all(a["rule"] == "non_finite" and a["value"] == "nan" for a in fired.values())
    # The next step's recomputed log-probs and entropy carry the NaN too.
    step_3 = {a["metric"] for a in anomalies if a["step"] == 3 and a["stage"] == "actor_compute_log_prob"}
    assert {"old_log_probs/nonfinite_count", "entropys/nonfinite_count"} <= step_3, anomalies
    assert sorted({p.relative_to(save_path).parts[0] for p in save_path.rglob("dump.json")}) == ["step_3"]
    # Step 3's recomputed log-probs raise an anomaly of their own, and actor_compute_log_prob
    # is forward-only: it is replayed, in its own folder; the NaN is in the weights, so the
    # replay shows it again.
    replay = "step_3/actor_compute_log_prob.replay/step0/rank0/dump.json"
    assert dump_files(save_path) == sorted([replay, *(f"step_3/{stage}/step0/rank0/dump.json" for stage in STAGES)])
    (verdict,) = [json.loads(line) for line in (save_path / "replays.jsonl").read_text().splitlines()]
    assert (verdict["step"], verdict["stage"], verdict["verdict"]) == (3, "actor_compute_log_prob", "reproducible")

    assert triage.argv[:2] == ["verl-events", "triage"]
    assert verl_events_main([*triage.argv[1:-1], on(root, triage.argv[-1]), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    # WeightFault's default: the first Linear layer's weight.
    assert result["found"] and result["op"]["parameter"] == "model.layers.0.self_attn.q_proj.weight", result
    assert "/step_3/" in result["dump"]

    # The actor worker (rank 0) sent each step's stage times and the anomalies to TensorBoard; the
    # driver, whose wait for generation the tracker does not see, opened no run of its own.
    assert sorted(p.name for p in (save_path / "tensorboard").iterdir()) == ["rank0"]
    sent = tensorboard_scalars(save_path / "tensorboard/rank0")
    assert {step for step in sent["stage_s/actor_update"]} == {1, 2, 3}
    assert {"stage_s/actor_compute_log_prob", "stage_s/ref_compute_log_prob", "stage_s/train_batch"} <= set(sent)
    counts = {key.removeprefix("anomalies/"): by_step for key, by_step in sent.items() if key.startswith("anomalies/")}
    # A stage's anomalies line begins at its first anomaly: step 1 is clean, so none has a point there.
    assert all(1 not in by_step for by_step in counts.values()), counts
    assert counts.get("actor_update", {}).get(2, 0) + counts.get("train_batch", {}).get(2, 0) >= 1, counts
