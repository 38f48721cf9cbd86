"""One claim on save_path for every observer that writes there.

Each observer lists what it writes (``Observer.outputs``); install refuses a
save_path holding another run's files of any of them, and the installation
claims the save_path (``run.json``) once, at the first stage a writer gets.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

import verl_events
from verl_events import ConfigError, ObserverError, stage
from verl_events.layout import RUN_FILE, owner_of
from verl_events.testing import RecordingObserver

from .faults.fault_observers import RunNote  # a third-party writer


def another_run_left(save_path: Path, relative: str, run: str = "first") -> Path:
    """A file as another run leaves it: under save_path, with that run's claim."""
    path = save_path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    (save_path / RUN_FILE).write_text(json.dumps({"run_id": run}))
    return path


def test_a_third_party_writers_files_from_another_run_make_install_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "first")
    with verl_events.install({"save_path": str(tmp_path)}, observers=[RunNote()]):
        with stage("actor_update", step=1):
            pass
    assert owner_of(tmp_path) == "first"
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "second")
    with pytest.raises(
        ConfigError,
        match=r"observer 'RunNote': save_path: .* already holds 1 run note\(s\) from another run "
        r"\(run 'first'; this is run 'second'\), e.g. .*step_1/actor_update/note_rank0.txt",
    ):
        verl_events.install({"save_path": str(tmp_path)}, observers=[RunNote()])
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "first")  # a process joining run "first" is welcome
    verl_events.install({"save_path": str(tmp_path)}, observers=[RunNote()]).close()


def test_an_nsys_report_of_another_run_makes_install_refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Refused before any observer is set up: the nsys observer's setup (which asks torch about CUDA) never runs.
    another_run_left(tmp_path, "nsys_4242.nsys-rep")
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "second")
    with pytest.raises(ConfigError, match=r"observers\[0\] \(nsys\): save_path: .* already holds 1 nsys report\(s\)"):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "nsys"}]})


@pytest.mark.parametrize(
    "relative",
    [
        "step_2/actor_update/torch_profiler_step_2_actor_update_rank0.pt.trace.json",  # discrete
        "step_2/torch_profiler_step_2-3_rank1.pt.trace.json",  # continuous
    ],
)
def test_a_torch_profiler_trace_of_another_run_makes_install_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: str
) -> None:
    another_run_left(tmp_path, relative)
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "second")
    with pytest.raises(
        ConfigError,
        match=r"observers\[1\] \(torch_profiler\): save_path: .* already holds 1 torch.profiler trace\(s\) "
        r"from another run \(run 'first'",
    ):
        verl_events.install(
            {"save_path": str(tmp_path), "observers": [{"name": "recording"}, {"name": "torch_profiler"}]}
        )


def test_a_real_torch_profiler_trace_keeps_the_next_run_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    config = {"save_path": str(tmp_path), "observers": [{"name": "torch_profiler", "steps": [1]}]}
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "first")
    with verl_events.install(config):
        with stage("actor_update", step=1):
            torch.ones(4).sum()
    assert (tmp_path / "step_1/actor_update/torch_profiler_step_1_actor_update_rank0.pt.trace.json").is_file()
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "second")
    with pytest.raises(ConfigError, match=r"already holds 1 torch.profiler trace\(s\) from another run"):
        verl_events.install(config)


def test_the_claim_waits_for_the_first_stage_a_writer_receives(tmp_path: Path) -> None:
    watcher = RecordingObserver()  # writes nothing: it never makes the claim
    notes = RunNote()
    notes.selection = verl_events.Selection.parse(stages=["actor_update"])
    with verl_events.install({"save_path": str(tmp_path)}, observers=[watcher, notes]):
        assert not (tmp_path / RUN_FILE).exists()  # install claims nothing: verl's driver runs no stage
        with stage("critic_update", step=1):
            pass
        assert not (tmp_path / RUN_FILE).exists()
        with stage("actor_update", step=1):
            assert owner_of(tmp_path) is not None  # before the writer's begin hook
    assert (tmp_path / "step_1/actor_update/note_rank0.txt").is_file()


def test_a_run_that_lost_its_save_path_switches_every_writer_off_with_one_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "late")
    watcher, notes = RecordingObserver(), RunNote()
    with verl_events.install(
        {"save_path": str(tmp_path), "observers": [{"name": "timing"}]}, observers=[watcher, notes]
    ):
        another_run_left(tmp_path, "timing/rank0.jsonl", run="early")  # a run started beside this one wrote first
        with caplog.at_level(logging.ERROR, logger="verl_events"):
            for step in (1, 2):
                with stage("actor_update", step=step):
                    pass
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "from another run (run 'early'; this is run 'late')" in errors[0]
    assert "'timing', 'RunNote' write nothing in this run" in errors[0]
    assert list(tmp_path.rglob("note_rank*.txt")) == []
    assert (tmp_path / "timing/rank0.jsonl").read_text() == "{}"
    assert len(watcher.calls) == 4  # the observer that writes nothing goes on


def test_in_strict_mode_a_lost_save_path_stops_the_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "late")
    with verl_events.install({"save_path": str(tmp_path), "strict": True}, observers=[RunNote()]):
        another_run_left(tmp_path, "step_1/actor_update/note_rank0.txt", run="early")
        with pytest.raises(ObserverError, match=r"observer\(s\) 'RunNote' cannot write to their save_path"):
            with stage("actor_update", step=1):
                pass


def test_observers_that_write_nothing_never_claim(tmp_path: Path) -> None:
    with verl_events.install({"save_path": str(tmp_path)}, observers=[RecordingObserver()]):
        with stage("actor_update", step=1):
            pass
    assert not (tmp_path / RUN_FILE).exists()


def test_a_folder_per_run_lets_the_same_config_run_twice_and_latest_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {"save_path": str(tmp_path / "profile/{run}"), "observers": [{"name": "timing"}]}
    latest = tmp_path / "profile/latest"
    for run in ("first", "second"):
        monkeypatch.setenv("VERL_EVENTS_RUN_ID", run)
        with verl_events.install(config):
            # Install claims nothing: latest still names the earlier run (or nothing yet).
            assert os.readlink(tmp_path / "profile/latest") == "first" if run == "second" else not latest.exists()
            with stage("actor_update", step=1):
                pass
        assert latest.resolve() == (tmp_path / "profile" / run).resolve()
    assert owner_of(tmp_path / "profile/first") == "first" and owner_of(tmp_path / "profile/second") == "second"
    assert os.readlink(latest) == "second"  # relative: the folder can move


def test_a_writer_that_prepares_no_folder_still_gets_its_claim(tmp_path: Path) -> None:
    save_path = tmp_path / "not/made/yet"
    note = RunNote()
    with verl_events.install({"save_path": str(save_path)}, observers=[note]):
        assert not save_path.exists()  # nothing set up a folder
        with stage("actor_update", step=1):
            pass
    assert owner_of(save_path) is not None and (save_path / "step_1/actor_update/note_rank0.txt").is_file()


def test_a_latest_that_is_a_real_folder_is_left_alone_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "profile/latest").mkdir(parents=True)  # not a link: someone's own folder
    with verl_events.install({"save_path": str(tmp_path / "profile/{run}")}, observers=[RunNote()]):
        with caplog.at_level(logging.WARNING, logger="verl_events"):
            with stage("actor_update", step=1):
                pass
    assert (tmp_path / "profile/latest").is_dir() and not (tmp_path / "profile/latest").is_symlink()
    assert "cannot point at this run's folder" in caplog.text
    assert not [p for p in (tmp_path / "profile").iterdir() if p.name.startswith(".latest")]  # no stray link


def test_a_late_process_of_an_older_run_does_not_move_latest_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {"save_path": str(tmp_path / "profile/{run}"), "observers": [{"name": "timing"}]}
    for run in ("older", "newer", "older"):  # the last: a worker of the older run starting late
        monkeypatch.setenv("VERL_EVENTS_RUN_ID", run)
        with verl_events.install(config):
            with stage("actor_update", step=1):
                pass
    assert os.readlink(tmp_path / "profile/latest") == "newer"
