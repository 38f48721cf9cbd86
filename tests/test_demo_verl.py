"""``verl-events demo --engine verl``: verl's real trainer on CPU, run as the documented command."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")  # verl's real trainer
pytest.importorskip("verl")
import yaml

from verl_events.apps import cli
from verl_events.apps.demo import verl_engine as demo_verl
from verl_events.apps.report.overhead import read_timing_records

from .support import verl_events_exe

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

ACTOR_REF = ("actor_compute_log_prob", "actor_update", "ref_compute_log_prob")
REPO = Path(__file__).resolve().parent.parent


def verl_events_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([verl_events_exe(), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.skipif(bool(demo_verl.missing_modules()), reason="needs verl-events[verl-cpu]")
def test_the_verl_engine_runs_verls_trainer_with_three_tools_stacked(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # Run from tmp_path, so that the job's files (outputs/verl-job) are built there.
    result = verl_events_cli("demo", "--engine", "verl", "--save-path", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "Stage overhead" in result.stderr and "ratio" in result.stderr
    assert "6 msprobe dump.json files" in result.stderr and "demo finished in" in result.stderr
    dumps = sorted(str(p.relative_to(out)) for p in out.rglob("dump.json"))
    assert dumps == sorted(f"step_{s}/{stage}/step0/rank0/dump.json" for s in (1, 2) for stage in ACTOR_REF)
    assert not list(out.glob("step_3/**/dump.json"))
    assert {r.step for r in read_timing_records(out)} == {1, 2, 3}
    traces = sorted(str(p.relative_to(out)) for p in out.rglob("torch_profiler_*.json"))
    assert traces == ["step_2/actor_update/torch_profiler_step_2_actor_update_rank0.pt.trace.json"]
    assert (tmp_path / "outputs/verl-job/job.json").is_file()
    assert yaml.safe_load((out / "observers.yaml").read_text())["save_path"] == str(out)


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
    assert "install verl-events[verl-cpu]" in capsys.readouterr().err


def test_the_example_file_holds_the_default_observers() -> None:
    example = yaml.safe_load((REPO / "examples/verl_demo.yaml").read_text())["observers"]
    default = demo_verl.default_config("x")["observers"]
    # The default relies on msprobe's built-in statistics L1 config, which the example names.
    assert [{k: v for k, v in entry.items() if k != "config_path"} for entry in example] == default
