from __future__ import annotations

from pathlib import Path

import pytest

from verl_events.cli import main


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
    config.write_text(f"save_path: {tmp_path}\nobservers:\n  - name: nsys\n    discrete: false\n    steps: [1, 2, 5]\n")
    assert main(["check", str(config)]) == 0
    assert "launch with: nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=repeat-shutdown:2" in capsys.readouterr().out
