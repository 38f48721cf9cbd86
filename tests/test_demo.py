"""The demo, run the way the README runs it: as the verl-events command."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")  # the demo trains with torch and dumps with msprobe
pytest.importorskip("msprobe")

from verl_events.apps.read.overhead import read_timing_records

from .support import run_as_printed, verl_events_exe

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

ACTOR_REF = ("actor_compute_log_prob", "actor_update", "ref_compute_log_prob")
ALL_STAGES = {
    "rollout_generate",
    "ref_compute_log_prob",
    "actor_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
}


def verl_events_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([verl_events_exe(), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def dumps(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("dump.json"))


def test_default_demo_dumps_actor_and_ref_stages_of_steps_1_and_2(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = verl_events_cli("demo", "--steps", "3", "--save-path", str(out))
    assert result.returncode == 0, result.stderr
    assert dumps(out) == [f"step_{s}/{stage}/step0/rank0/dump.json" for s in (1, 2) for stage in ACTOR_REF]
    for path in out.rglob("dump.json"):
        header = json.loads(path.read_text())
        assert (header["task"], header["level"]) == ("statistics", "L1") and header["data"]
    records = read_timing_records(out)
    assert len(records) == 3 * 6 and {r.stage for r in records} == ALL_STAGES
    assert {(r.step, r.stage) for r in records if r.profiled} == {(s, st) for s in (1, 2) for st in ACTOR_REF}
    assert "Stage overhead" in result.stderr and "ratio" in result.stderr and "demo finished in" in result.stderr


def test_two_processes_dump_each_rank_under_the_same_step_and_stage(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = verl_events_cli("demo", "--steps", "2", "--nproc", "2", "--save-path", str(out))
    assert result.returncode == 0, result.stderr
    assert dumps(out) == sorted(
        f"step_{s}/{stage}/step0/rank{r}/dump.json" for s in (1, 2) for stage in ACTOR_REF for r in (0, 1)
    )
    # Gradients are all-reduced across the two ranks inside actor_update.
    entries = json.loads((out / "step_1/actor_update/step0/rank1/dump.json").read_text())["data"]
    assert any(key.startswith("Distributed.all_reduce") for key in entries)
    assert sorted(p.name for p in (out / "timing").iterdir()) == ["rank0.jsonl", "rank1.jsonl"]
    assert "demo: step 2/2 on 2 ranks" in result.stderr  # progress from rank 0


def test_a_config_file_replaces_the_default_observers(tmp_path: Path) -> None:
    config = tmp_path / "observers.yaml"
    config.write_text("observers:\n  - name: msprobe\n    steps: [2]\n    stages: [critic_update]\n")
    out = tmp_path / "run"
    # From tmp_path, so that the demo names its folder relative to it: "run".
    result = verl_events_cli("demo", "--steps", "2", "--config", str(config), "--save-path", "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert dumps(out) == ["step_2/critic_update/step0/rank0/dump.json"]
    assert "1 msprobe dump.json file under run: step_2/critic_update/step0/rank0/dump.json" in result.stderr
    # No timing observer, so no report to see it again: the closing line's command is the
    # diagnosis, and it runs as printed, from the shell the demo ran in.
    again = run_as_printed(result.stderr, "read it again with: ", tmp_path)
    assert again.returncode == 0 and "verdict: healthy" in again.stdout and "msprobe" in again.stdout, again
    assert " diagnose run\n" in result.stderr and " report " not in result.stderr
    assert str(tmp_path) not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "--steps 0 is not allowed; use 1 or more"),
        (["--nproc", "0"], "--nproc 0 is not allowed"),
        (["--config", "/nonexistent/observers.yaml"], "cannot be read"),
    ],
)
def test_bad_demo_arguments_exit_2_with_a_message(args: list[str], message: str) -> None:
    result = verl_events_cli("demo", *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_reusing_a_save_path_with_dumps_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert verl_events_cli("demo", "--steps", "1", "--save-path", str(out)).returncode == 0
    again = verl_events_cli("demo", "--steps", "1", "--save-path", str(out))
    assert again.returncode == 2
    assert "(timing): save_path: " in again.stderr and "already holds 1 timing log(s) from another run" in again.stderr


def test_the_stacked_example_runs_three_tools_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    repo = Path(__file__).parent.parent
    result = subprocess.run(
        [
            verl_events_exe(),
            "demo",
            "--config",
            "examples/stacked.yaml",
            "--steps",
            "4",
            "--save-path",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=repo,
    )
    assert result.returncode == 0, result.stderr
    assert dumps(out) == [f"step_{s}/{stage}/step0/rank0/dump.json" for s in (1, 2) for stage in ACTOR_REF]
    traces = sorted(p.parent.name for p in out.glob("step_3/*/torch_profiler_step_3_*_rank0.pt.trace.json"))
    assert traces == sorted(ALL_STAGES)
    profiled_by = {(r.step, r.profiled_by) for r in read_timing_records(out) if r.profiled}
    assert profiled_by == {(1, ("msprobe",)), (2, ("msprobe",)), (3, ("torch_profiler",))}


def test_a_bad_msprobe_config_with_two_processes_is_one_clean_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"task": "statistics", "level": "L9"}')
    config = tmp_path / "c.yaml"
    config.write_text(f"save_path: {tmp_path / 'run'}\nobservers:\n  - name: msprobe\n    config_path: {bad}\n")
    result = verl_events_cli("demo", "--steps", "1", "--nproc", "2", "--config", str(config))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "ProcessRaisedException" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: observers[0] (msprobe): ")


def test_a_demo_without_dumps_says_so_in_words(tmp_path: Path) -> None:
    config = tmp_path / "timing.yaml"
    config.write_text("observers:\n  - name: timing\n")
    result = verl_events_cli("demo", "--steps", "1", "--config", str(config), "--save-path", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    assert "no msprobe dumps: the config has no msprobe observer" in result.stderr and "(none)" not in result.stderr


def test_a_demo_whose_msprobe_observer_selected_nothing_says_so(tmp_path: Path) -> None:
    config = tmp_path / "late.yaml"
    config.write_text("observers:\n  - name: msprobe\n    steps: [5]\n  - name: timing\n")
    out = tmp_path / "run"
    result = verl_events_cli("demo", "--steps", "1", "--config", str(config), "--save-path", str(out))
    assert result.returncode == 0, result.stderr
    assert f"no msprobe dumps under {out}: the msprobe observer selected no stage that ran" in result.stderr


@pytest.mark.parametrize("config", [None, "always_on"])
def test_every_command_diagnose_suggests_runs_as_printed(config: str | None, tmp_path: Path) -> None:
    """The commands beside each tool's line (compare on a run's dumps, mismatch where nothing
    was compared) run when pasted: an answer (0) or an alarm (1), never bad input (2)."""
    args = ["demo", "--steps", "3", "--save-path", "run", *(["--config", config] if config else [])]
    assert verl_events_cli(*args, cwd=tmp_path).returncode == 0
    diagnosis = verl_events_cli("diagnose", "run", "--json", cwd=tmp_path)
    assert diagnosis.returncode == 0, diagnosis.stderr
    tools = json.loads(diagnosis.stdout)["tools"]
    suggested = [tool["command"] for tool in tools if tool["command"] is not None]
    assert any(" report " in command for command in suggested), tools
    if config is None:  # the default demo dumps two steps: compare them
        assert "verl-events compare run --stage actor_compute_log_prob --rank 0 --step 1 --vs-step 2" in suggested
    else:  # the tiny engine has no rollout log-probs: mismatch has nothing to show, and says why
        (line,) = [tool for tool in tools if tool["tool"] == "mismatch"]
        assert line["command"] is None and "none compared" in line["summary"], line
    for command in suggested:
        pasted = subprocess.run(
            [verl_events_exe(), *shlex.split(command)[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert pasted.returncode in (0, 1), f"{command!r} exited {pasted.returncode}: {pasted.stderr}"


def test_the_always_on_demo_says_what_each_watcher_saw_the_silent_ones_too(tmp_path: Path) -> None:
    result = verl_events_cli("demo", "--steps", "3", "--save-path", "run", "--config", "always_on", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    saw = result.stderr.split("what the observers saw (", 1)[1].split("demo finished", 1)[0]
    assert "diagnose run tells what it means):" in saw
    assert "watchdog  1 rank heartbeat(s): 1 closed" in saw
    assert "mismatch  3 mismatch line(s), none compared: the batch carries no rollout_log_probs" in saw
    assert "memory    1 memory log(s): the highest host peak " in saw  # and where: a rank, a step, a stage
    assert re.search(r"memory .* MB \(rank 0, step [1-3]'s \w+\)", saw), saw
    assert "timing    18 stage record(s) from 1 rank(s)" in saw
    assert "sentinel  no anomaly record file(s): it found nothing to write" in saw  # on, and silent
