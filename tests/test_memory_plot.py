"""``verl-events report --memory-plot``: each stage's memory over the steps, on records the real
memory observer wrote for real stages (as tests/test_memory.py runs them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import verl_events
from verl_events import stage
from verl_events.apps.cli import main
from verl_events.apps.report.memory import read_memory
from verl_events.apps.report.memory_plot import StageMemoryLine, memory_figure, memory_lines
from verl_events.apps.report.steps import STAGE_ORDER
from verl_events.observers.memory.host import read_status

from .memory_support import StandInCuda, allocate
from .support import run_steps

MB = 1 << 20
PNG = b"\x89PNG\r\n\x1a\n"
INSTALL_HINT = "pip install matplotlib (or, in a checkout of verl-events, pip install -e '.[plot]')"
pytestmark = pytest.mark.skipif(read_status() is None, reason="needs Linux /proc/self/status")


def lines_of(run: Path) -> dict[str, StageMemoryLine]:
    return {line.stage: line for line in memory_lines(read_memory(run, []), list(STAGE_ORDER))}


def observed(run: Path) -> verl_events.Installation:
    return verl_events.install({"save_path": str(run), "observers": [{"name": "timing"}, {"name": "memory"}]})


@pytest.fixture
def leaking_run(tmp_path: Path) -> Path:
    """Six steps: actor_update keeps 50 MB more at each, ref_compute_log_prob peaks 100 MB and gives it back."""
    kept = []
    with observed(tmp_path):
        for step in range(1, 7):
            with stage("actor_update", role="actor", step=step):
                kept.append(torch.ones(50 * MB // 4))
            with stage("ref_compute_log_prob", role="ref", step=step):
                allocate(100)
    return tmp_path


def test_a_stage_that_allocates_peaks_above_its_begin_at_every_step_and_an_idle_one_does_not(tmp_path: Path) -> None:
    with observed(tmp_path):
        for step in (1, 2, 3):
            with stage("actor_update", role="actor", step=step):
                allocate(200)
            with stage("ref_compute_log_prob", role="ref", step=step):
                pass
    lines = lines_of(tmp_path)
    assert list(lines) == ["ref_compute_log_prob", "actor_update"]  # the report's order: verl's
    update, idle = lines["actor_update"], lines["ref_compute_log_prob"]
    assert update.steps == idle.steps == (1, 2, 3)
    for peak, begin, rise in zip(update.host_peak_mb, update.host_begin_mb, update.host_rise_mb, strict=True):
        assert begin is not None and rise is not None
        assert peak - begin >= 150 and rise >= 150
    assert all(rise is not None and rise < 50 for rise in idle.host_rise_mb)
    assert set(update.device_peak_mb) == {None} and not update.leak and not idle.leak


def test_each_step_takes_the_largest_rank(tmp_path: Path) -> None:
    with observed(tmp_path):
        for step in (1, 2):
            with stage("actor_update", role="actor", step=step, rank=0):
                allocate(20)
            with stage("actor_update", role="actor", step=step, rank=1):
                allocate(200)
    assert {path.name for path in (tmp_path / "memory").iterdir()} == {"rank0.jsonl", "rank1.jsonl"}
    (update,) = lines_of(tmp_path).values()
    assert update.steps == (1, 2)
    assert all(rise is not None and rise >= 150 for rise in update.host_rise_mb)  # rank 1's, not rank 0's


def test_a_stage_outside_the_steps_has_no_line(tmp_path: Path) -> None:
    with observed(tmp_path):
        with stage("actor_update", role="actor", step=1):
            pass
        with stage("save_checkpoint"):  # no step announced
            pass
    assert list(lines_of(tmp_path)) == ["actor_update"]


def test_the_leaking_stage_is_flagged_drawn_thicker_and_named_a_leak(leaking_run: Path) -> None:
    lines = lines_of(leaking_run)
    update, ref = lines["actor_update"], lines["ref_compute_log_prob"]
    assert update.leak and 45 <= update.kept_median_mb <= 60 and not ref.leak
    assert update.steps == ref.steps == (1, 2, 3, 4, 5, 6)
    first, last = update.host_begin_mb[0], update.host_begin_mb[-1]
    assert first is not None and last is not None and last - first >= 200  # the trend: 50 MB more a step
    figure = memory_figure(list(lines.values()))
    host, rise = figure.axes  # no device: no device panel
    labels = [text.get_text() for legend in figure.legends for text in legend.get_texts()]
    assert "ref_compute_log_prob" in labels and "peak" in labels and "begin" in labels
    assert [label for label in labels if "leak" in label] == [
        f"actor_update - leak: keeps {update.kept_median_mb:+.1f} MB a step"
    ]
    assert [text.get_text() for text in host.texts] == ["leak"]
    peaks = {tuple(line.get_ydata()): line.get_linewidth() for line in host.get_lines()}
    assert peaks[update.host_peak_mb] > peaks[ref.host_peak_mb]


def test_the_cli_writes_the_png_and_says_so(
    leaking_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    picture = tmp_path / "figures" / "memory.png"  # its folder made
    assert main(["report", str(leaking_run), "--memory-plot", str(picture)]) == 0
    output = capsys.readouterr()
    assert picture.read_bytes()[:8] == PNG and picture.stat().st_size > 10_000
    assert "Memory by stage" in output.out and f"--memory-plot: wrote {picture}" in output.err


def test_the_device_peak_gets_a_panel_when_the_records_carry_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device is tests/memory_support.py's stand-in for torch.cuda (checked there against torch's
    own signatures): no CUDA device runs here."""
    cuda = StandInCuda()
    monkeypatch.setattr("verl_events.observers.memory.observer.device_module", lambda: ("cuda", cuda))
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "memory"}]}):
        for step in (1, 2):
            with stage("actor_update", role="actor", step=step):
                cuda.alloc(step * 2**30)
                cuda.allocated -= step * 2**30
    (update,) = lines_of(tmp_path).values()
    assert update.device_peak_mb == (1024.0, 2048.0)
    assert len(memory_figure([update]).axes) == 3


@pytest.mark.parametrize("name", ["memory.txt", "memory"])
def test_a_file_of_no_figure_format_is_refused_naming_the_option_and_the_formats(
    leaking_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    picture = tmp_path / "figures" / name
    assert main(["report", str(leaking_run), "--memory-plot", str(picture)]) == 2
    output = capsys.readouterr()
    assert output.out == "" and not picture.parent.exists()  # refused before the report printed anything
    assert output.err.startswith(f"error: --memory-plot {picture}: ")
    assert "is not allowed; the figure is written as .png, .svg or .pdf" in output.err


def test_a_run_without_memory_records_is_an_error_that_names_the_observer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with verl_events.install({"save_path": str(tmp_path / "run"), "observers": [{"name": "timing"}]}):
        run_steps(range(1, 3))
    picture = tmp_path / "memory.png"
    assert main(["report", str(tmp_path / "run"), "--memory-plot", str(picture)]) == 2
    output = capsys.readouterr()
    assert output.out == "" and not picture.exists()
    assert output.err.startswith(f"error: --memory-plot: {tmp_path / 'run'} has no memory records")
    assert "record the run with the memory observer (name: memory)" in output.err


def test_without_matplotlib_the_error_names_the_install(
    leaking_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without it gives
    assert main(["report", str(leaking_run), "--memory-plot", str(tmp_path / "m.png"), "--quiet"]) == 2
    output = capsys.readouterr()
    assert output.out == ""
    assert f"--memory-plot needs matplotlib: {INSTALL_HINT}" in output.err
