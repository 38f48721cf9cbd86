from __future__ import annotations

from pathlib import Path

import pytest

from verl_events import STAGE_ROLES
from verl_events.apps.cli import main


def test_check_lists_the_observers_a_config_builds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {tmp_path}\nobservers:\n  - name: recording\n    steps: ['1-2']\n")
    assert main(["check", str(config), "observers.0.priority=7"]) == 0
    out = capsys.readouterr().out
    assert "recording" in out and "priority=7" in out and "steps=[1,2]" in out and "stages=all" in out


def test_check_reports_config_errors_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("observers:\n  - name: nope\n")
    assert main(["check", str(config)]) == 2
    assert "'nope' is not an installed observer" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:nsys. CUDA is not available")
def test_check_prints_the_nsys_launch_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    # optional: the core suite runs without nvtx, and check refuses a missing tool otherwise
    config.write_text(
        f"save_path: {tmp_path}\nobservers:\n  - name: nsys\n    optional: true\n"
        "    discrete: false\n    steps: [1, 2, 5]\n"
    )
    assert main(["check", str(config)]) == 0
    assert (
        "launch with: nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi "
        "--capture-range-end=repeat-shutdown:2" in capsys.readouterr().out
    )


def test_check_writes_nothing_and_shows_where_each_observer_comes_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "not_yet"
    config = tmp_path / "c.yaml"
    config.write_text(
        # optional: the core suite runs without msprobe, and check refuses a missing tool otherwise
        f"save_path: {out}\nobservers:\n  - name: msprobe\n    optional: true\n    steps: [1]\n    quiet: false\n"
        "  - name: timing\n"
    )
    assert main(["check", str(config)]) == 0
    printed = capsys.readouterr().out
    assert not out.exists()
    assert "from entry point 'msprobe' -> verl_events.observers.msprobe:MsprobeObserver, from verl-events " in printed
    assert "options: quiet=False" in printed


def test_check_after_a_run_notes_the_runs_files_and_cut_off_sessions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rank_dir = tmp_path / "step_2/actor_update/step0/rank0"
    rank_dir.mkdir(parents=True)
    (rank_dir / "session.incomplete").write_text("cut off during step 2 actor_update (rank 0)\n")
    (tmp_path / "run.json").write_text('{"run_id": "run-1"}')
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {tmp_path}\nobservers:\n  - name: timing\n")
    assert main(["check", str(config)]) == 0
    printed = capsys.readouterr().out
    assert "note: save_path holds 1 msprobe dump(s) of run 'run-1'; a new run there is refused" in printed
    assert f"note: {rank_dir} is an incomplete msprobe session: cut off during step 2 actor_update (rank 0)" in printed


def test_check_after_a_run_notes_every_tools_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The note asks each tool's format owner what the save_path holds, not only msprobe and timing."""
    (tmp_path / "timing").mkdir()
    for rank in (0, 1):
        (tmp_path / f"timing/rank{rank}.jsonl").write_text("")
    (tmp_path / "anomalies.jsonl").write_text("")
    (tmp_path / "replays.jsonl").write_text("")
    (tmp_path / "heartbeats").mkdir()
    (tmp_path / "heartbeats/rank0.json").write_text("{}")
    (tmp_path / "hangs.jsonl").write_text("")
    (tmp_path / "mismatch.jsonl").write_text("")
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {tmp_path}\nobservers:\n  - name: timing\n")
    assert main(["check", str(config)]) == 0
    assert (
        "note: save_path holds 2 watchdog file(s), 1 mismatch record file(s), 2 timing log(s) and "
        "2 anomaly record file(s) of an earlier run; a new run there is refused, a process of that run may join it"
    ) in capsys.readouterr().out


def test_check_prints_each_warning_as_one_line_without_a_source_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config's own warnings (an unknown stage: load_config warns) as much as the observers'."""
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {tmp_path}\nobservers:\n  - name: timing\n    stages: [my_stage]\n")
    assert main(["check", str(config)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "warning: observers[0].stages: 'my_stage' is not a stage verl runs; known stages: "
        + ", ".join(STAGE_ROLES)
        + ". Custom stages emitted by your own code are fine."
    ]


def test_check_of_a_folder_per_run_says_a_new_run_gets_its_own_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With save_path: .../{run}, the latest run's files refuse nothing."""
    latest_run = tmp_path / "profile/run-a"
    (latest_run / "timing").mkdir(parents=True)
    (latest_run / "timing/rank0.jsonl").write_text("")
    (latest_run / "run.json").write_text('{"run_id": "run-a"}')
    (tmp_path / "profile/latest").symlink_to("run-a")
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {tmp_path / 'profile'}/{{run}}\nobservers:\n  - name: timing\n")
    assert main(["check", str(config)]) == 0
    out = capsys.readouterr().out
    assert (
        "note: the latest run's folder holds 1 timing log(s) of run 'run-a'; a new run gets a folder of its own, "
        "a process of that run joins it there"
    ) in out
    assert "refused" not in out


def test_check_says_an_empty_config_observes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("")
    assert main(["check", str(config)]) == 0
    assert "has no observers; nothing will be observed" in capsys.readouterr().err


@pytest.mark.parametrize("override", ["observers.0.steps=[1", "observers.5.steps=1"])
def test_a_bad_override_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("observers:\n  - name: timing\n")
    assert main(["check", str(config), override]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: override {override!r}")


def test_an_unwritable_output_is_one_error_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    (tmp_path / "timing").mkdir()
    (tmp_path / "timing/rank0.jsonl").write_text(
        '{"stage": "actor_update", "step": 1, "rank": 0, "elapsed_s": 0.1, "profiled": false}\n'
    )
    assert main(["report", str(tmp_path), "--trace", str(blocker / "trace.json"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --trace ") and "cannot be created" in err and len(err.strip().splitlines()) == 1


def test_check_shows_an_armed_observer_and_refuses_one_without_a_sentinel(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("msprobe")  # check refuses an msprobe observer where msprobe is missing
    # The example in place: its config_path is taken from its own folder.
    config = Path(__file__).parent.parent / "examples" / "sentinel_spike.yaml"
    assert main(["check", str(config)]) == 0
    out = capsys.readouterr().out
    (msprobe,) = [line for line in out.splitlines() if line.strip().startswith("msprobe ")]
    assert "steps=[2] and 1 after each anomaly (at most 1 time)" in msprobe
    # msprobe is armed on the actor's and ref's stages: the two forward-only ones replay.
    replay = "replay: after an anomaly, stages run again for the armed observers: "
    assert replay + "actor_compute_log_prob, ref_compute_log_prob\n" in out
    assert main(["check", str(config), "replay=false"]) == 0
    assert "replay: off (replay: false)" in capsys.readouterr().out
    assert main(["check", str(config), "observers.0.enabled=false"]) == 2
    assert (
        "observer 'msprobe' has trigger: anomaly, but no installed observer sends anomalies" in capsys.readouterr().err
    )


def test_check_fails_when_an_observers_tool_is_missing_and_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch_npu needs Ascend hardware: it is missing on every machine these tests run on."""
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {tmp_path / 'out'}\nobservers:\n  - name: timing\n  - name: npu\n")
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "error: observers[1] (npu): torch_npu is not importable" in err
    assert "mark the observer optional: true to run without it" in err
    assert not (tmp_path / "out").exists()  # check writes nothing


def test_check_warns_of_a_missing_tool_of_an_optional_observer_and_lists_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {tmp_path}\nobservers:\n  - name: npu\n    optional: true\n")
    assert main(["check", str(config)]) == 0
    printed = capsys.readouterr()
    assert "warning: observers[0] (npu): torch_npu is not importable" in printed.err
    assert "it is optional, so the run goes on without it" in printed.err
    assert "  npu " in printed.out


def test_an_optional_observer_without_its_tool_is_a_warning_even_in_strict_mode(tmp_path: Path) -> None:
    import verl_events
    from verl_events import ObserverSetupError, VerlEventsWarning

    config = {"save_path": str(tmp_path), "strict": True, "observers": [{"name": "npu"}]}
    with pytest.raises(ObserverSetupError, match="torch_npu is not importable"):
        verl_events.install(config)
    config["observers"] = [{"name": "npu", "optional": True}]
    with pytest.warns(VerlEventsWarning, match="torch_npu is not importable .* The npu observer is off"):
        verl_events.install(config).close()


def test_check_shows_a_folder_per_run_as_written_and_where_latest_points(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {tmp_path / 'profile'}/{{run}}\nobservers:\n  - name: recording\n")
    assert main(["check", str(config)]) == 0
    assert f"save_path: {tmp_path / 'profile'}/{{run}} (a folder per run; latest: none yet)" in capsys.readouterr().out
    (tmp_path / "profile/run-a").mkdir(parents=True)
    (tmp_path / "profile/latest").symlink_to("run-a")
    assert main(["check", str(config)]) == 0
    assert f"latest: {(tmp_path / 'profile/run-a').resolve()})" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["triage", "report"])
def test_a_folder_of_runs_is_read_through_its_latest_run_and_says_so(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runs are one level down: each command reads the newest, and what it says is of that
    run (here an empty one), never of the folder above it."""
    (tmp_path / "run-a").mkdir()
    (tmp_path / "latest").symlink_to("run-a")
    code = main([command, str(tmp_path)])
    out, err = capsys.readouterr()
    assert f"note: {tmp_path} holds runs, a folder each; reading the newest, {tmp_path / 'latest'}" in err
    if command == "report":
        assert code == 2 and f"error: {tmp_path / 'latest'} has no timing logs" in err, err
    else:
        assert code == 0 and f"no anomalies recorded in {tmp_path / 'latest'}/anomalies.jsonl" in out.lower(), out


@pytest.mark.parametrize("save_path", ["/", "/proc", "/proc/self/verl", "/etc"])
def test_check_warns_about_a_save_path_in_a_system_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], save_path: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {save_path}\nobservers:\n  - name: recording\n")
    assert main(["check", str(config)]) == 0
    said = capsys.readouterr().err
    assert f"warning: save_path '{save_path}' is the system folder" in said and "choose a folder of your own" in said


def test_check_warns_about_a_save_path_that_is_a_file_and_says_target_code_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {a_file}\nobservers:\n  - _target_: verl_events.testing:RecordingObserver\n")
    assert main(["check", str(config)]) == 0
    out, err = capsys.readouterr()
    assert f"warning: save_path '{a_file}' is an existing file; observers write a folder there" in err
    assert "note: the _target_ observers were imported and built to check them: their modules' code ran here" in out
    assert a_file.read_text() == "mine"
    config.write_text(f"save_path: {tmp_path / 'out'}\nobservers:\n  - name: recording\n")
    assert main(["check", str(config)]) == 0
    out, err = capsys.readouterr()
    assert "_target_" not in out and "warning" not in err  # a plain config: neither


def test_verl_events_alone_says_what_to_keep_on_and_what_to_run_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "VERL_EVENTS_CONFIG=always_on python3 -m verl.trainer.main_ppo" in out
    assert "verl-events diagnose outputs/profile/latest" in out


def test_a_folder_of_runs_is_read_through_its_latest_link_and_the_note_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``diagnose outputs/demo`` (the parent of ``latest``) reads the newest run, not nothing."""
    import verl_events

    config = {"save_path": str(tmp_path / "runs/{run}"), "observers": [{"name": "timing"}]}
    with verl_events.install(config):
        with verl_events.stage("actor_update", step=1):
            pass
    latest = tmp_path / "runs/latest"
    assert latest.is_symlink()
    for command in (["diagnose"], ["report"], ["hangs"]):
        code = main([*command, str(tmp_path / "runs")])
        captured = capsys.readouterr()
        assert f"note: {tmp_path / 'runs'} holds runs, a folder each; reading the newest, {latest}" in captured.err
        if command == ["diagnose"]:
            assert code == 0 and "verdict: healthy" in captured.out, captured
        if command == ["report"]:
            assert code == 0 and "actor_update" in captured.out, captured
