"""``verl-events demo --engine verl``: verl's real trainer on CPU, run as the documented command."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")
import yaml

from verl_events.apps import cli
from verl_events.apps.demo import verl_engine as demo_verl
from verl_events.apps.read.overhead import read_timing_records

from .support import run_as_printed, verl_events_exe

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

ACTOR_REF = ("actor_compute_log_prob", "actor_update", "ref_compute_log_prob")
REPO = Path(__file__).resolve().parent.parent


def verl_events_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([verl_events_exe(), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.skipif(bool(demo_verl.missing_modules()), reason="needs the verl-cpu extra")
def test_the_verl_engine_runs_verls_trainer_with_three_tools_stacked(tmp_path: Path) -> None:
    # Run from tmp_path, as a newcomer runs it: the job's files (outputs/verl-job) and
    # the run's folder (outputs/verl-demo/{run}) are built there.
    result = verl_events_cli("demo", "--engine", "verl", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    latest = tmp_path / "outputs/verl-demo/latest"
    assert latest.is_symlink(), sorted(p.name for p in latest.parent.iterdir())
    out = latest.resolve()
    assert out.parent == (tmp_path / "outputs/verl-demo").resolve() and out.name.startswith("run-")
    shown = f"outputs/verl-demo/{out.name}"  # paths under the working directory are shown relative to it
    assert "Stage overhead" in result.stderr and "ratio" in result.stderr
    assert f"6 msprobe dump.json files under {shown} (first: step_1/" in result.stderr
    assert f" report {shown}\n" in result.stderr
    again = run_as_printed(result.stderr, "see it again with: ", tmp_path)  # runs as printed
    assert again.returncode == 0 and "actor_update" in again.stdout, again.stderr
    dumps = sorted(str(p.relative_to(out)) for p in out.rglob("dump.json"))
    assert dumps == sorted(f"step_{s}/{stage}/step0/rank0/dump.json" for s in (1, 2) for stage in ACTOR_REF)
    assert not list(out.glob("step_3/**/dump.json"))
    records = read_timing_records(out)
    assert {r.step for r in records if r.stage in ACTOR_REF} == {1, 2, 3}
    # The sync of the starting weights is step 0's; each step's own follows its update.
    assert sorted(r.step for r in records if r.stage == "update_weights") == [0, 1, 2, 3]
    traces = sorted(str(p.relative_to(out)) for p in out.rglob("torch_profiler_*.json"))
    assert traces == ["step_2/actor_update/torch_profiler_step_2_actor_update_rank0.pt.trace.json"]
    assert (tmp_path / "outputs/verl-job/job.json").is_file()
    assert yaml.safe_load((out / "observers.yaml").read_text())["save_path"] == str(out)
    # verl's own output goes to the run's log; ours names it, each step, and every file written.
    log = (out / "trainer.log").read_text()
    assert "step:3 - " in log and "engine is not available" in log
    assert "engine is not available" not in result.stderr + result.stdout and "step:1 - " not in result.stderr
    assert f"demo: verl's output goes to {shown}/trainer.log" in result.stderr
    assert [line.split(" done")[0] for line in result.stderr.splitlines() if line.startswith("demo: step ")] == [
        f"demo: step {s}/3" for s in (1, 2, 3)
    ]
    for written in [
        "timing: timing/rank0.jsonl",
        f"torch_profiler: {traces[0]}",
        "VERL_EVENTS_CONFIG: observers.yaml",
        "verl: trainer.log",
    ]:
        assert f"  {written}\n" in result.stderr
    assert result.stderr.count("  msprobe: step_") == 6
    assert result.stderr.rstrip().splitlines()[-1].startswith("demo finished in ")


@pytest.mark.skipif(bool(demo_verl.missing_modules()), reason="needs the verl-cpu extra")
def test_a_failing_trainer_shows_the_end_of_its_log_and_returns_its_exit_code(tmp_path: Path) -> None:
    """verl imports every module in VERL_USE_EXTERNAL_MODULES at start: one that does not
    exist makes main_ppo fail in seconds, the way a broken job would."""
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="no_module_of_this_name")
    result = subprocess.run(
        [verl_events_exe(), "demo", "--engine", "verl", "--save-path", "run"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "the end of verl's trainer output (run/trainer.log):" in result.stderr
    assert "No module named 'no_module_of_this_name'" in result.stderr
    last = result.stderr.rstrip().splitlines()[-1]
    assert last == "error: verl's trainer (main_ppo) exited with code 1; its output is in run/trainer.log"
    assert "No module named 'no_module_of_this_name'" in (tmp_path / "run/trainer.log").read_text()


def test_an_option_of_the_tiny_engine_is_refused_by_name() -> None:
    result = verl_events_cli("demo", "--engine", "verl", "--nproc", "2")
    assert result.returncode == 2
    assert "error: --nproc 2 is not supported with --engine verl" in result.stderr


def test_without_the_verl_cpu_extra_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "verl" else real(name, *a))
    assert cli.main(["demo", "--engine", "verl"]) == 2
    said = capsys.readouterr().err
    assert "error: --engine verl needs verl, not installed here; install the verl-cpu extra" in said
    assert "pip install '.[verl-cpu]' in the clone" in said


def test_the_example_file_holds_the_default_observers() -> None:
    example = yaml.safe_load((REPO / "examples/verl_demo.yaml").read_text())["observers"]
    default = demo_verl.default_config("x")["observers"]
    # The default relies on msprobe's built-in statistics L1 config, which the example names.
    assert [{k: v for k, v in entry.items() if k != "config_path"} for entry in example] == default
