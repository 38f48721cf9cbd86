"""The checkpoint observer on real torch state: a model and its AdamW optimizer saved and
loaded the way verl's checkpoint manager does it (one ``torch.save`` per part, files named as
verl names them), inside real ``save_checkpoint`` / ``load_checkpoint`` stages on the bus.
The same on verl's real trainer with two FSDP ranks: tests/test_verl_checkpoints.py."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import verl_events
from verl_events import stage
from verl_events.apps.cli import main as verl_events_main
from verl_events.bus.progress import LoopEnded
from verl_events.observers.checkpoint import taps
from verl_events.observers.checkpoint.judge import judge_loop
from verl_events.observers.checkpoint.record import CheckpointRecord, checkpoint_log_path, manifest_path
from verl_events.verl import training

FILES = {
    "model": "model_world_size_1_rank_0.pt",
    "optimizer": "optim_world_size_1_rank_0.pt",
    "extra": "extra_state_world_size_1_rank_0.pt",
}


class Trainer:
    """A model, its optimizer and a scheduler, saved and loaded part by part as verl does."""

    def __init__(self, root: Path) -> None:
        torch.manual_seed(0)
        self.root = root
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.01)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)

    def folder(self, step: int, kind: str = "actor") -> Path:
        return self.root / "checkpoints" / f"global_step_{step}" / kind

    def update(self, step: int) -> None:
        with stage("actor_update", step=step):
            self.model(torch.randn(3, 4)).sum().backward()
            self.optimizer.step()
            self.optimizer.zero_grad()

    def save(self, step: int, optimizer_state: Any = None, kind: str = "actor") -> None:
        folder = self.folder(step, kind)
        folder.mkdir(parents=True, exist_ok=True)
        with stage("save_checkpoint", step=step, path=str(folder)):
            torch.save(self.model.state_dict(), folder / FILES["model"])
            torch.save(optimizer_state or self.optimizer.state_dict(), folder / FILES["optimizer"])
            extra = {"lr_scheduler": self.scheduler.state_dict(), "rng": {"cpu": torch.get_rng_state()}}
            torch.save(extra, folder / FILES["extra"])

    def load(self, step: int, *, optimizer: bool = True) -> None:
        folder = self.folder(step)
        with stage("load_checkpoint", step=step, path=str(folder)):
            self.model.load_state_dict(torch.load(folder / FILES["model"]))
            state = torch.load(folder / FILES["optimizer"])
            if optimizer:
                self.optimizer.load_state_dict(state)
            extra = torch.load(folder / FILES["extra"], weights_only=False)
            self.scheduler.load_state_dict(extra["lr_scheduler"])


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[Trainer]:
    config = {"save_path": str(tmp_path / "profile"), "observers": [{"name": "checkpoint"}]}
    with verl_events.install(config):
        yield Trainer(tmp_path)


def records(root: Path, kind: str) -> list[CheckpointRecord]:
    lines = checkpoint_log_path(root / "profile").read_text().splitlines()
    return [r for r in map(CheckpointRecord.from_json, lines) if r.kind == kind]


def test_each_save_has_a_manifest_of_every_tensor_beside_its_files(trainer: Trainer) -> None:
    for step in (1, 2):
        trainer.update(step)
        trainer.save(step)
    saved = records(trainer.root, "saved")
    assert [(r.step, r.updates, r.alarms) for r in saved] == [(1, 1, []), (2, 1, [])]
    assert [r.step for r in records(trainer.root, "began")] == [1, 2]
    record = saved[1]
    assert record.parts["model"] == {"tensors": 4, "bytes": sum(p.numel() * 4 for p in trainer.model.parameters())}
    assert record.parts["optimizer"]["tensors"] == 12  # step, exp_avg, exp_avg_sq of each of the 4 parameters
    for file in record.files:
        assert (trainer.folder(2) / file["name"]).stat().st_size == file["bytes"]
    manifest = json.loads(manifest_path(trainer.folder(2), 0).read_text())
    assert set(manifest["tensors"]) == {"model", "optimizer", "extra"}
    assert manifest["tensors"]["model"]["0.weight"][:3] == [[8, 4], "float32", 128]


def test_a_save_whose_optimizer_state_did_not_change_although_it_stepped_is_unchanged(trainer: Trainer) -> None:
    trainer.update(1)
    first = copy.deepcopy(trainer.optimizer.state_dict())  # a copy, as a stale async save keeps one
    trainer.save(1, optimizer_state=first)
    trainer.update(2)
    trainer.save(2, optimizer_state=first)
    trainer.save(3)  # no update since step 2: equal state is right, and it is not equal anyway
    alarms = {r.step: [(a.kind, a.part, a.count) for a in r.alarms] for r in records(trainer.root, "saved")}
    assert alarms == {1: [], 2: [("unchanged", "optimizer", 12)], 3: []}


def test_a_save_without_an_update_since_the_previous_one_may_be_identical(trainer: Trainer) -> None:
    trainer.update(1)
    trainer.save(1)
    trainer.save(2)
    assert [r.alarms for r in records(trainer.root, "saved")] == [[], []]
    assert [r.updates for r in records(trainer.root, "saved")] == [1, 0]


def test_the_actors_and_the_critics_saves_of_one_step_each_count_the_updates_since_their_own_last(
    trainer: Trainer,
) -> None:
    for step in (1, 2):
        trainer.update(step)
        trainer.save(step, kind="critic")
        trainer.save(step, kind="actor")
    assert [(r.path and Path(r.path).name, r.updates) for r in records(trainer.root, "saved")] == [
        ("critic", 1),
        ("actor", 1),
        ("critic", 1),
        ("actor", 1),
    ]


def test_a_save_holding_nan_is_nonfinite(trainer: Trainer) -> None:
    with torch.no_grad():
        trainer.model[1].bias[0] = float("nan")
    trainer.save(1)
    (record,) = records(trainer.root, "saved")
    assert [(a.kind, a.part, a.tensors) for a in record.alarms] == [("nonfinite", "model", ["1.bias"])]


def test_a_load_compares_what_the_rank_holds_with_the_manifest(trainer: Trainer) -> None:
    trainer.update(1)
    trainer.save(1)
    trainer.update(2)  # what the load must undo
    trainer.load(1)
    (loaded,) = records(trainer.root, "loaded")
    manifest = json.loads(manifest_path(trainer.folder(1), 0).read_text())
    assert loaded.alarms == []
    assert loaded.compared == sum(len(tensors) for tensors in manifest["tensors"].values())


def test_a_load_that_skips_the_optimizer_is_not_restored(trainer: Trainer) -> None:
    trainer.update(1)
    trainer.save(1)
    trainer.load(1, optimizer=False)
    (loaded,) = records(trainer.root, "loaded")
    (alarm,) = loaded.alarms
    assert (alarm.kind, alarm.part, alarm.count) == ("not_restored", "optimizer", 13)  # 12 tensors and the settings
    assert "the optimizer was never loaded" in alarm.detail


def test_a_file_changed_on_disk_since_the_save_is_not_restored_naming_the_tensor(trainer: Trainer) -> None:
    trainer.update(1)
    trainer.save(1)
    state = trainer.model.state_dict()
    state["1.weight"] = state["1.weight"] + 1
    torch.save(state, trainer.folder(1) / FILES["model"])  # outside any stage: not a save
    trainer.load(1)
    (loaded,) = records(trainer.root, "loaded")
    found = {(a.kind, a.part, tuple(a.tensors)) for a in loaded.alarms}
    assert ("not_restored", "model", ("1.weight",)) in found
    assert any("as it is on disk now" in a.detail for a in loaded.alarms)
    assert len(records(trainer.root, "saved")) == 1


def test_loading_an_older_checkpoint_than_the_folders_latest_is_wrong_checkpoint(trainer: Trainer) -> None:
    for step in (1, 2):
        trainer.update(step)
        trainer.save(step)
    trainer.load(1)
    (loaded,) = records(trainer.root, "loaded")
    (alarm,) = loaded.alarms
    assert alarm.kind == "wrong_checkpoint" and str(trainer.folder(2)) in alarm.detail


def test_a_folder_without_our_manifest_is_wrong_checkpoint_saying_so(trainer: Trainer) -> None:
    trainer.save(1)
    manifest_path(trainer.folder(1), 0).unlink()
    trainer.load(1)
    (alarm,) = records(trainer.root, "loaded")[0].alarms
    assert alarm.kind == "wrong_checkpoint" and "holds no manifest of ours for rank 0" in alarm.detail


def test_a_fifo_where_the_manifest_belongs_is_read_as_no_manifest_without_blocking(trainer: Trainer) -> None:
    trainer.save(1)
    path = manifest_path(trainer.folder(1), 0)
    path.unlink()
    os.mkfifo(path)
    trainer.load(1)
    (alarm,) = records(trainer.root, "loaded")[0].alarms
    assert alarm.kind == "wrong_checkpoint" and "a FIFO" in alarm.detail


def test_the_taps_see_nothing_outside_a_checkpoint_stage_and_come_off_with_the_observer(tmp_path: Path) -> None:
    original = torch.save
    config = {"save_path": str(tmp_path / "profile"), "observers": [{"name": "checkpoint"}]}
    with verl_events.install(config):
        assert torch.save is not original
        torch.save({"w": torch.ones(2)}, tmp_path / "elsewhere.pt")
        assert taps.current() is None
    assert torch.save is original and torch.optim.Optimizer.load_state_dict.__name__ == "load_state_dict"
    assert not checkpoint_log_path(tmp_path / "profile").exists()


def test_a_save_cut_short_and_a_file_cut_short_are_incomplete_and_a_removed_one_is_not(
    trainer: Trainer, capsys: pytest.CaptureFixture[str]
) -> None:
    for step in (1, 2, 3):
        trainer.update(step)
        trainer.save(step)
    with open(trainer.folder(2) / FILES["optimizer"], "r+b") as file:
        file.truncate(10)
    for name in FILES.values():
        (trainer.folder(3) / name).unlink()
    began = records(trainer.root, "began")[0]
    line = json.dumps(began.to_data() | {"step": 4, "path": str(trainer.folder(4)), "time": began.time + 60})
    with checkpoint_log_path(trainer.root / "profile").open("a") as log:
        log.write(line + "\n")  # a save of step 4 that began and never ended
    run = str(trainer.root / "profile")
    assert verl_events_main(["checkpoints", run, "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert [(a["step"], a["kind"]) for a in shown["alarms"]] == [(2, "incomplete"), (4, "incomplete")]
    assert f"{FILES['optimizer']} (10 bytes now," in shown["alarms"][0]["detail"]
    assert "left no manifest" in shown["alarms"][1]["detail"]
    assert sorted(shown["saves"][2]["gone"]) == sorted(FILES.values())


def test_checkpoints_renders_saves_loads_and_alarms_and_diagnose_names_them(
    trainer: Trainer, capsys: pytest.CaptureFixture[str]
) -> None:
    for step in (1, 2):
        trainer.update(step)
        trainer.save(step)
    trainer.load(2, optimizer=False)
    run = str(trainer.root / "profile")
    for _ in range(2):
        assert verl_events_main(["checkpoints", run]) == 1
        out = capsys.readouterr().out
        assert "2 save(s) on 1 rank(s), steps 1-2, 1 load(s); 1 alarm" in out
        assert "step 2, rank 0, load: not_restored (optimizer): the optimizer was never loaded" in out
        assert (
            "tensors: state.0.step, state.0.exp_avg, state.0.exp_avg_sq, state.1.step, state.1.exp_avg and 8 more"
            in out
        )
    assert verl_events_main(["diagnose", run]) == 1
    out = capsys.readouterr().out
    assert "checkpoint alarm not_restored (optimizer)" in out
    assert "2 checkpoint save(s), 1 load(s): 1 alarm(s): not_restored" in out


def test_checkpoints_without_a_ledger_or_with_only_damaged_lines_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verl_events_main(["checkpoints", str(tmp_path)]) == 2
    assert "no checkpoints.jsonl: no checkpoint observer watched this run" in capsys.readouterr().err
    (tmp_path / "checkpoints.jsonl").write_text(
        json.dumps({"run": "r", "kind": "saved", "step": 1, "rank": 0, "time": 1.0, "files": [{"name": "../x"}]}) + "\n"
    )
    assert verl_events_main(["checkpoints", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no checkpoint record" in err and "'../x' is not a file name" in err


class Loop:
    """verl's trainer as the driver wrapper sees it: a step counter and total_training_steps."""

    def __init__(self, checkpoint_step: int, total: int, trains: int) -> None:
        self.checkpoint_step, self.total_training_steps, self.trains = checkpoint_step, total, trains
        self.global_steps = 0

    @training.load_checkpoint
    def _load_checkpoint(self) -> None:
        self.global_steps = self.checkpoint_step

    @training.fit
    def fit(self) -> None:
        self._load_checkpoint()
        self.global_steps += 1  # verl: "we start from step 1"
        for _ in range(self.trains):
            self.global_steps += 1


@pytest.mark.parametrize(
    ("checkpoint_step", "total", "trains", "kinds"),
    [
        (2, 2, 0, ["no_progress"]),  # verl #7401: resumed, nothing left, exit 0
        (2, 5, 1, ["no_progress"]),  # fewer than asked, no failure
        (2, 3, 1, []),
        (0, 2, 2, []),  # fresh
    ],
)
def test_the_drivers_loop_end_is_judged_against_what_it_was_asked(
    trainer: Trainer, checkpoint_step: int, total: int, trains: int, kinds: list[str]
) -> None:
    Loop(checkpoint_step, total, trains).fit()
    (record,) = records(trainer.root, "loop_ended")
    assert record.rank == -1 and record.resumed_from == (checkpoint_step or None)
    assert record.last_step == checkpoint_step + trains
    assert [a.kind for a in record.alarms] == kinds


def test_a_validation_only_run_is_no_loop_to_judge() -> None:
    assert judge_loop(LoopEnded(resumed_from=None, total_steps=2, last_step=2)) == []
    ended = training._loop_ended(type("T", (), {"global_steps": 0, "config": _Config(val_only=True)})())
    assert ended is None


class _Config:
    def __init__(self, **trainer: Any) -> None:
        self.trainer = trainer
