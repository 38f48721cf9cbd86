"""The checkpoint observer on verl 0.9.1's real trainer — ``python -m verl.trainer.main_ppo``,
the default (v1) trainer under Ray, FSDP2 on gloo, CPU, two FSDP ranks — saving every step
and resuming (issue 44).

Three trainer runs, about a minute each on 2 cores, on one checkpoint folder:

* **first**: three steps, a save at each, into ``checkpoints/``.  Steps 1 and 2 are healthy.
  At step 3 the optimizer state handed to the save is step 2's
  (:class:`tests.checkpoint_faults.StaleOptimizerSave`, NeMo RL #4183: ``unchanged``), and
  rank 1 is SIGKILLed halfway through writing its optimizer file
  (:class:`~tests.checkpoint_faults.KillInSave`: ``incomplete``; diagnose names the kill
  first).  verl's tracker still names step 2, and the resumes load it;
* **asked for nothing**: resumed from step 2 with ``total_training_steps=2`` (verl #7401's
  resumed job that exits 0 having trained nothing: ``no_progress``), rank 1's optimizer
  load skipped by a user's observer (:class:`~tests.checkpoint_faults.SkipOptimizerLoad`:
  ``not_restored``);
* **healthy resume**: resumed from step 2 with ``total_training_steps=3``: it loads, trains
  step 3 and saves it over the one that died; no alarm, and every tensor of the manifest
  compared.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")

from verl_events.apps.cli import main as verl_events_main
from verl_events.apps.verl_cpu import job
from verl_events.observers.checkpoint.record import CheckpointRecord, checkpoint_log_path, manifest_path, read_manifest

from .support import REPO, doc_blocks, on

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]

TWO_RANKS = ["trainer.n_gpus_per_node=2", "+ray_kwargs.ray_init.num_gpus=2", "ray_kwargs.ray_init.num_cpus=16"]
SAVE_EVERY_STEP = ["trainer.save_freq=1"]
TIMEOUT_S = 600
WATCHED = [{"name": "checkpoint"}, {"name": "watchdog"}]
CHECKPOINTS_DOC = (REPO / "docs/checkpoints.md").read_text()


@dataclass(frozen=True)
class Run:
    save_path: Path
    code: int
    log: str

    def records(self) -> list[CheckpointRecord]:
        lines = checkpoint_log_path(self.save_path).read_text().splitlines()
        return [CheckpointRecord.from_json(line) for line in lines]

    def of(self, kind: str) -> dict[tuple[int | None, int], CheckpointRecord]:
        return {(r.step, r.rank): r for r in self.records() if r.kind == kind}


def _train(files: job.JobFiles, name: str, observers: list[dict[str, Any]], *extra: str, steps: int = 2) -> Run:
    root = files.root / name
    root.mkdir()
    save_path = root / "profile"
    config = root / "observers.yaml"
    config.write_text(json.dumps({"save_path": str(save_path), "observers": observers}))
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_EVENTS_")}
    # The faults are a user's observers in this repository's tests package: every Ray worker imports them.
    path = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH", "")) if p)
    env = job.trainer_env(base) | {"VERL_EVENTS_CONFIG": str(config), "PYTHONPATH": path}
    args = job.trainer_args(files, steps=steps, save_path=save_path)
    overrides = job.merge_overrides(args, [*TWO_RANKS, *SAVE_EVERY_STEP, *extra])
    log = root / "trainer.log"
    code = job.run_trainer(overrides, env, log=log, timeout=TIMEOUT_S)
    return Run(save_path, code, log.read_text())


@dataclass(frozen=True)
class Resumes:
    first: Run
    asked_nothing: Run
    resumed: Run
    checkpoints: Path
    root: Path


@pytest.fixture(scope="module")
def resumes(tmp_path_factory: pytest.TempPathFactory) -> Resumes:
    files = job.prepare(tmp_path_factory.mktemp("checkpoint-job"))
    # Step 3's save holds step 2's optimizer state (cached at step 2's save), and rank 1 dies in it.
    stale = {"_target_": "tests.checkpoint_faults:StaleOptimizerSave", "steps": [2, 3], "stages": ["save_checkpoint"]}
    kill = {"_target_": "tests.checkpoint_faults:KillInSave", "step": 3, "ranks": [1], "stages": ["save_checkpoint"]}
    first = _train(files, "first", [*WATCHED, stale, kill], steps=3)
    skip = {"_target_": "tests.checkpoint_faults:SkipOptimizerLoad", "ranks": [1], "stages": ["load_checkpoint"]}
    asked_nothing = _train(files, "asked-nothing", [*WATCHED, skip], "trainer.resume_mode=auto", steps=2)
    resumed = _train(files, "resumed", WATCHED, "trainer.resume_mode=auto", steps=3)
    return Resumes(first, asked_nothing, resumed, files.root / "checkpoints", files.root)


def test_each_healthy_save_has_a_manifest_per_rank_beside_verls_files(resumes: Resumes) -> None:
    run = resumes.first
    saved = {key: record for key, record in run.of("saved").items() if key[0] in (1, 2)}
    assert sorted(saved) == [(step, rank) for step in (1, 2) for rank in (0, 1)]
    for (step, rank), record in saved.items():
        assert record.alarms == [] and record.error is None, record
        assert record.updates == 1, record  # one actor_update since the previous save (or the start)
        assert {"model", "optimizer", "extra"} <= set(record.parts), record
        folder = Path(record.path or "")
        assert folder == resumes.checkpoints / f"global_step_{step}" / "actor"
        for file in record.files:  # each file verl wrote, with its size
            assert (folder / file["name"]).stat().st_size == file["bytes"], file
        manifest = read_manifest(manifest_path(folder, rank))
        assert (manifest.step, manifest.rank) == (step, rank)
        assert {p: len(t) for p, t in manifest.tensors.items()}["model"] == record.parts["model"]["tensors"]
    assert sorted(run.of("began")) == [(step, rank) for step in (1, 2, 3) for rank in (0, 1)]


def test_the_healthy_resume_compares_every_tensor_of_the_save_and_raises_no_alarm(
    resumes: Resumes, capsys: pytest.CaptureFixture[str]
) -> None:
    run = resumes.resumed
    assert run.code == 0, run.log[-6000:]
    loaded = run.of("loaded")
    assert sorted(loaded) == [(2, 0), (2, 1)]
    for (_, rank), record in loaded.items():
        assert record.alarms == [], record
        manifest = read_manifest(manifest_path(resumes.checkpoints / "global_step_2" / "actor", rank))
        tensors = [name for part in manifest.tensors.values() for name in part if name != "(values)"]
        assert record.compared == len(tensors), record
    assert sorted(run.of("saved")) == [(3, 0), (3, 1)]
    (loop,) = run.of("loop_ended").values()
    assert (loop.resumed_from, loop.total_steps, loop.last_step, loop.alarms) == (2, 3, 3, [])
    assert verl_events_main(["checkpoints", str(run.save_path)]) == 0
    assert "no alarms" in capsys.readouterr().out
    assert verl_events_main(["diagnose", str(run.save_path)]) == 0
    out = capsys.readouterr().out
    assert "verdict: healthy" in out and "2 checkpoint save(s), 2 load(s) on 2 rank(s): no alarm" in out


def test_a_resume_that_trains_nothing_and_a_load_that_skips_the_optimizer_are_alarms(
    resumes: Resumes, capsys: pytest.CaptureFixture[str]
) -> None:
    run = resumes.asked_nothing
    assert run.code == 0, run.log[-6000:]  # verl exits 0: nothing but the ledger says anything is wrong
    loaded = run.of("loaded")
    assert loaded[(2, 0)].alarms == []
    (skipped,) = loaded[(2, 1)].alarms
    assert (skipped.kind, skipped.part) == ("not_restored", "optimizer"), skipped
    assert "never loaded" in skipped.detail and skipped.count > 0
    (loop,) = run.of("loop_ended").values()
    assert (loop.resumed_from, loop.last_step) == (2, 2)
    assert [a.kind for a in loop.alarms] == ["no_progress"]
    assert "resumed from step 2" in loop.alarms[0].detail and "trained no step" in loop.alarms[0].detail
    assert run.of("saved") == {}
    assert verl_events_main(["checkpoints", str(run.save_path)]) == 1
    out = capsys.readouterr().out
    assert "step 2, rank 1, load: not_restored (optimizer): the optimizer was never loaded" in out
    assert "driver, loop: no_progress" in out
    assert verl_events_main(["diagnose", str(run.save_path)]) == 1
    out = capsys.readouterr().out
    assert "verdict: anomalous" in out and "checkpoint alarm not_restored (optimizer)" in out


def test_a_stale_optimizer_save_is_unchanged_and_a_save_cut_by_sigkill_is_incomplete_after_the_kill(
    resumes: Resumes, capsys: pytest.CaptureFixture[str]
) -> None:
    faults = resumes.first
    assert faults.code != 0, faults.log[-6000:]
    saved = faults.of("saved")
    stale = [(a.kind, a.part) for a in saved[(3, 0)].alarms]
    assert stale == [("unchanged", "optimizer")], saved[(3, 0)]
    assert saved[(3, 0)].error is not None  # its last barrier waited for rank 1, which had died
    assert (3, 1) not in saved and (3, 1) in faults.of("began")
    assert faults.of("loop_ended") == {}  # the loop raised: its end is the failure's
    assert verl_events_main(["checkpoints", str(faults.save_path), "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    cut = [a for a in shown["alarms"] if a["kind"] == "incomplete" and a["rank"] == 1]
    assert len(cut) == 1 and cut[0]["step"] == 3 and "left no manifest" in cut[0]["detail"], shown["alarms"]
    assert verl_events_main(["diagnose", str(faults.save_path), "--json"]) == 1
    diagnosis = json.loads(capsys.readouterr().out)
    first = diagnosis["first"]
    assert (first["rank"], first["kind"]) == (1, "killed"), first
    # The alarms are findings, not deaths: after the kill, diagnose names them on the tool's line.
    (line,) = [tool for tool in diagnosis["tools"] if tool["tool"] == "checkpoint"]
    assert line["summary"] == "6 checkpoint save(s), 0 load(s) on 2 rank(s): 3 alarm(s): incomplete, unchanged", line


def test_the_docs_config_is_the_one_these_runs_use() -> None:
    (config,) = [block for block in doc_blocks("yaml", CHECKPOINTS_DOC) if "name: checkpoint" in block]
    assert [line.split("- name: ")[1] for line in config.splitlines() if "- name: " in line] == [
        observer["name"] for observer in WATCHED
    ]


def test_the_docs_commands_print_the_docs_output_twice_in_a_row(
    resumes: Resumes, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/checkpoints.md's commands, each followed by its output, run on these runs.  Only the
    clock times diagnose prints differ from one run to the next; the doc shows diagnose's
    output down to the checkpoint's line (what follows, Ray's teardown of the ranks, varies)."""
    commands = doc_blocks("bash", CHECKPOINTS_DOC)
    shown = doc_blocks("text", CHECKPOINTS_DOC)
    assert len(commands) == len(shown) == 3
    for command, output in zip(commands, shown, strict=True):
        argv = on(resumes.root, command).split()[1:]
        expected = _times_masked(on(resumes.root, output))
        for _ in range(2):
            verl_events_main(argv)
            out = _times_masked(capsys.readouterr().out)
            if argv[0] == "diagnose":
                assert out.startswith(expected), (out, expected)
            else:
                assert out == expected, command


def _times_masked(text: str) -> str:
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z", "<time>", text.strip())
