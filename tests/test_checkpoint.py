"""The checkpoint observer on real torch state: a model and its AdamW optimizer saved and
loaded the way verl's checkpoint manager does it (one ``torch.save`` per part, files named as
verl names them), inside real ``save_checkpoint`` / ``load_checkpoint`` stages on the bus.
The same on verl's real trainer with two FSDP ranks: tests/test_verl_checkpoints.py."""

from __future__ import annotations

import copy
import json
import os
import time
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
    tensors = [name for part in manifest["tensors"].values() for name in part if name != "(values)"]
    assert loaded.compared == len(tensors) == 4 + 12 + 1  # the model, AdamW's state, the RNG state


def test_a_load_that_skips_the_optimizer_is_not_restored(trainer: Trainer) -> None:
    trainer.update(1)
    trainer.save(1)
    trainer.load(1, optimizer=False)
    (loaded,) = records(trainer.root, "loaded")
    (alarm,) = loaded.alarms
    assert (alarm.kind, alarm.part, alarm.count) == ("not_restored", "optimizer", 12)
    assert alarm.tensors[-1] == "(values)"  # its settings (lr, betas, ...) were not restored either
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
            "tensors: state.0.step, state.0.exp_avg, state.0.exp_avg_sq, state.1.step, state.1.exp_avg and 7 more"
            in out
        )
    assert verl_events_main(["diagnose", run]) == 1
    out = capsys.readouterr().out
    assert "checkpoint alarm not_restored (optimizer)" in out
    assert "2 checkpoint save(s), 1 load(s) on 1 rank(s): 1 alarm(s): not_restored" in out


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


@pytest.mark.slow
def test_fsdp1s_sharded_state_is_described_shard_by_shard_on_two_gloo_ranks(tmp_path: Path) -> None:
    """verl's ``strategy: fsdp`` saves FSDP1's SHARDED_STATE_DICT: each value a ShardedTensor
    (a Tensor whose data is its local shards).  Two gloo ranks save and resume it."""
    from .support import run_two_gloo_ranks

    config = {"save_path": str(tmp_path / "profile"), "observers": [{"name": "checkpoint"}]}
    (tmp_path / "observers.json").write_text(json.dumps(config))
    body = f"""
        import torch
        import verl_events
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
        torch.manual_seed(0)
        folder = {str(tmp_path)!r} + "/checkpoints/global_step_1/actor"
        os.makedirs(folder, exist_ok=True)
        with verl_events.install({str(tmp_path / "observers.json")!r}):
            layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
            model = FSDP(layers, device_id=torch.device("cpu"))
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
            with verl_events.stage("actor_update", step=1):
                model(torch.randn(3, 4)).sum().backward()
                optimizer.step()
            names = [f"{{folder}}/{{part}}_world_size_2_rank_{{rank}}.pt" for part in ("model", "optim")]
            with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
                with verl_events.stage("save_checkpoint", step=1, path=folder):
                    torch.save(model.state_dict(), names[0])
                    torch.save(optimizer.state_dict(), names[1])
                dist.barrier()
                with verl_events.stage("load_checkpoint", step=1, path=folder):
                    model.load_state_dict(torch.load(names[0], weights_only=False))
                    optimizer.load_state_dict(torch.load(names[1], weights_only=False))
        dist.destroy_process_group()
    """
    result = run_two_gloo_ranks(tmp_path, body, 180)
    assert result.returncode == 0, result.stderr[-4000:]
    saved, loaded = records(tmp_path, "saved"), records(tmp_path, "loaded")
    assert sorted(r.rank for r in saved) == sorted(r.rank for r in loaded) == [0, 1]
    for record in saved:
        assert record.parts["model"]["tensors"] == 4 and record.alarms == [], record
    manifest = json.loads(manifest_path(tmp_path / "checkpoints/global_step_1/actor", 0).read_text())
    assert "0.weight#shard0" in manifest["tensors"]["model"]
    for record in loaded:
        assert record.alarms == [] and record.compared and record.compared >= 4, record


def test_a_later_folder_from_a_save_that_died_is_no_later_save_when_verls_tracker_says_so(trainer: Trainer) -> None:
    """verl writes latest_checkpointed_iteration.txt once every rank saved: a save that died
    after this rank wrote its manifest leaves a later folder that verl rightly skips."""
    for step in (1, 2):
        trainer.update(step)
        trainer.save(step)
    tracker = trainer.root / "checkpoints" / "latest_checkpointed_iteration.txt"
    tracker.write_text("1")
    trainer.load(1)
    tracker.write_text("2")
    trainer.load(1)
    first, second = records(trainer.root, "loaded")
    assert first.alarms == []
    (alarm,) = second.alarms
    assert alarm.kind == "wrong_checkpoint" and "names step 2" in alarm.detail


def test_a_manifest_of_another_rank_or_step_is_not_compared(trainer: Trainer) -> None:
    trainer.save(1)
    path = manifest_path(trainer.folder(1), 0)
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps(manifest | {"rank": 3}))
    trainer.load(1)
    path.write_text(json.dumps(manifest | {"step": 7}))
    trainer.load(1)
    path.write_text(json.dumps(manifest | {"format": True}))
    trainer.load(1)
    details = [r.alarms[0].detail for r in records(trainer.root, "loaded")]
    assert "names rank 3, not 0" in details[0]
    assert "written by the save of step 7, not of step 1" in details[1]
    assert "not a verl_events manifest of format 1" in details[2]
    assert all(r.compared is None for r in records(trainer.root, "loaded"))


def test_a_state_that_cannot_be_described_after_the_load_never_breaks_the_load(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer.update(1)
    trainer.save(1)

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no state dict here")

    monkeypatch.setattr(torch.optim.AdamW, "state_dict", broken)
    trainer.load(1)  # the load itself goes on
    (loaded,) = records(trainer.root, "loaded")
    assert loaded.alarms == []  # the optimizer is not compared: no false alarm
    assert loaded.compared == 4 + 1  # the model and the RNG state


def test_a_tap_whose_observer_closed_during_its_stage_sees_nothing_more(tmp_path: Path) -> None:
    config = {"save_path": str(tmp_path / "profile"), "observers": [{"name": "checkpoint"}]}
    installation = verl_events.install(config)
    with stage("save_checkpoint", step=1, path=str(tmp_path)):
        tap = taps.current()
        assert tap is not None
        installation.close()
        torch.save({"w": torch.ones(2)}, tmp_path / "model_world_size_1_rank_0.pt")
    assert tap.saved == [] and taps.current() is None


def test_the_taps_come_off_under_a_later_patch_and_are_not_stacked_twice(tmp_path: Path) -> None:
    config = {"save_path": str(tmp_path / "profile"), "observers": [{"name": "checkpoint"}]}
    original = torch.save
    with verl_events.install(config):
        ours = torch.save

        def later(*args: Any, **kwargs: Any) -> Any:
            return ours(*args, **kwargs)

        torch.save = later  # someone patched it after us
    try:
        assert torch.save is later
        with verl_events.install(config), stage("save_checkpoint", step=1, path=str(tmp_path)):
            torch.save({"w": torch.ones(2)}, tmp_path / "model_world_size_1_rank_0.pt")
            tap = taps.current()
            assert tap is not None and len(tap.saved) == 1  # described once, not twice
    finally:
        torch.save = original
    # The later patch is gone (the original is back): the taps go on again.
    with verl_events.install(config), stage("save_checkpoint", step=2, path=str(tmp_path)):
        torch.save({"w": torch.ones(2)}, tmp_path / "model_world_size_1_rank_0.pt")
        tap = taps.current()
        assert tap is not None and len(tap.saved) == 1
    assert torch.save is original


def test_damaged_ledger_lines_are_skipped_and_no_control_sequence_reaches_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"run": "r", "step": 1, "time": 1.0}
    lines = [
        base | {"kind": "saved", "rank": -7},  # no such rank
        base | {"kind": "loop_ended", "rank": 0},  # the loop's end is the driver's
        base | {"kind": "saved", "rank": 0, "files": [{"name": "model\x1b[2J.pt", "part": "model", "bytes": 1}]},
        base | {"kind": "began", "rank": 0, "path": "/ckpt/global_step_1/actor\x1b]0;owned\x07"},
        base
        | {
            "kind": "saved",
            "rank": 1,
            "path": "/etc",
            "files": [{"name": "passwd", "part": "other", "bytes": 1}],
            "alarms": [{"kind": "nonfinite", "part": "model", "tensors": ["w\x1b[31m"], "count": 1, "detail": "x\ny"}],
        },
    ]
    (tmp_path / "checkpoints.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert verl_events_main(["checkpoints", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out and "\x07" not in captured.out
    assert "/ckpt/global_step_1/actor?]0;owned?" in captured.out
    assert "nonfinite (model): x?y" in captured.out and "tensors: w?[31m" in captured.out
    assert captured.err.count("checkpoints.jsonl:") == 3, captured.err  # the two ranks and the file name
    assert verl_events_main(["diagnose", str(tmp_path)]) == 1
    assert capsys.readouterr().err.count("checkpoints.jsonl:1:") == 1  # read once, warned once
    assert verl_events_main(["checkpoints", str(tmp_path), "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    # /etc is no checkpoint folder: its "file" is not looked at, so no incomplete alarm comes of it.
    assert [(a["rank"], a["kind"]) for a in shown["alarms"]] == [(0, "incomplete"), (1, "nonfinite")]


def test_diagnose_reads_a_save_being_written_on_a_rank_that_beats_as_running_not_cut_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {
        "save_path": str(tmp_path / "profile"),
        "observers": [{"name": "checkpoint"}, {"name": "watchdog", "heartbeat_s": 0.2}],
    }
    trainer = Trainer(tmp_path)
    with verl_events.install(config):
        with stage("save_checkpoint", step=1, path=str(trainer.folder(1))):
            beat = tmp_path / "profile" / "heartbeats" / "rank0.json"
            deadline = time.monotonic() + 30
            while "save_checkpoint" not in (beat.read_text() if beat.exists() else "") and time.monotonic() < deadline:
                time.sleep(0.05)  # the watchdog's thread writes the stage into the heartbeat
            assert verl_events_main(["diagnose", str(tmp_path / "profile"), "--json"]) == 0
            writing = json.loads(capsys.readouterr().out)
            assert verl_events_main(["checkpoints", str(tmp_path / "profile")]) == 1  # the ledger alone cannot tell
            assert "or, on a run still going, is writing it now" in capsys.readouterr().out
        trainer.save(2)
    assert writing["verdict"] == "running" and writing["first"] is None, writing


def test_a_selection_without_the_update_stages_counts_no_update_and_judges_nothing_unchanged(tmp_path: Path) -> None:
    observers = [{"name": "checkpoint", "stages": ["save_checkpoint", "load_checkpoint"]}]
    with verl_events.install({"save_path": str(tmp_path / "profile"), "observers": observers}):
        trainer = Trainer(tmp_path)
        trainer.update(1)
        trainer.save(1)
        trainer.save(2)
    assert [(r.updates, r.alarms) for r in records(tmp_path, "saved")] == [(None, []), (None, [])]


def test_a_save_stage_without_a_path_takes_its_folder_from_the_files_it_wrote(trainer: Trainer) -> None:
    """A save emitted by hand (``stage("save_checkpoint", step=N)``): its began line has no
    folder, its saved line has the files' one, and the two are one finished save."""
    folder = trainer.folder(1)
    folder.mkdir(parents=True)
    with stage("save_checkpoint", step=1):
        torch.save(trainer.model.state_dict(), folder / FILES["model"])
    (began,) = records(trainer.root, "began")
    (saved,) = records(trainer.root, "saved")
    assert (began.path, saved.path) == (None, str(folder))
    assert manifest_path(folder, 0).is_file()
    assert verl_events_main(["checkpoints", str(trainer.root / "profile"), "--json"]) == 0
