"""Ctrl-C (SIGINT) to ``verl-events demo`` at several moments.

``fault_observers:Interrupter`` stops the demo at the moment and prints
``WAITING ...``; the test sends SIGINT only then.  Moments: during install,
before any stage; half-way through the forward pass in step 1's
actor_update, whose msprobe session is open; inside the body of step 2's compute_values, which is not
dumped, after five whole sessions.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..support import verl_events_exe
from .processes import Child, check_save_path, cli, entries, marker, markers_under, session

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

CONFIG = """\
observers:
  - name: timing
  - name: msprobe
    steps: ["1-2"]
    stages: [actor_compute_log_prob, ref_compute_log_prob, actor_update]
  - _target_: fault_observers:Interrupter
    moment: {moment}
    steps: [{step}]
    stages: [{stage}]
"""
MOMENTS = {  # name: (Interrupter's moment, step, stage)
    "install": ("install", 1, "actor_update"),
    "dumped stage": ("body", 1, "actor_update"),
    "undumped stage": ("body", 2, "compute_values"),
}
DEMO_STAGES = [
    "rollout_generate",
    "ref_compute_log_prob",
    "actor_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
]
DUMPED = ("ref_compute_log_prob", "actor_compute_log_prob", "actor_update")


@dataclass(frozen=True)
class Interrupted:
    save_path: Path
    returncode: int
    stderr: str


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Interrupted]:
    """Run the demo once per moment, interrupted there (cached for the module)."""
    done: dict[str, Interrupted] = {}

    def at(name: str) -> Interrupted:
        if name not in done:
            moment, step, stage = MOMENTS[name]
            root = tmp_path_factory.mktemp("interrupted")
            config = root / "observers.yaml"
            config.write_text(CONFIG.format(moment=moment, step=step, stage=stage))
            save_path = root / "run"
            child = Child(
                [verl_events_exe(), "demo", "--steps", "3", "--config", str(config), "--save-path", str(save_path)]
            )
            child.wait_for("WAITING")
            child.proc.send_signal(signal.SIGINT)
            done[name] = Interrupted(save_path, child.finish(), child.stderr)
        return done[name]

    return at


def timing_records(save_path: Path) -> list[tuple[int, str, str | None]]:
    lines = (save_path / "timing" / "rank0.jsonl").read_text(encoding="utf-8").splitlines()
    return [(r["step"], r["stage"], r["error"]) for r in map(json.loads, lines)]


@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_exits_130_with_one_line_and_no_traceback(
    interrupted: Callable[[str], Interrupted], moment: str
) -> None:
    run = interrupted(moment)
    assert run.returncode == 130, run.stderr
    assert run.stderr.strip().splitlines()[-1] == "verl-events: interrupted"
    assert "Traceback" not in run.stderr


def test_ctrl_c_in_a_dumped_stage_marks_its_session_raised_keyboard_interrupt(
    interrupted: Callable[[str], Interrupted],
) -> None:
    run = interrupted("dumped stage")
    cut = session(run.save_path, 1, "actor_update")
    assert (
        marker(cut)
        == "step 1 actor_update (rank 0) raised KeyboardInterrupt; the dump holds the stage only up to there"
    )
    assert markers_under(run.save_path) == [cut]
    # The session was stopped, so msprobe wrote what it had: the forward
    # pass up to the interrupt, no backward.
    recorded = entries(cut)
    assert recorded and all(".forward" in key for key in recorded)


@pytest.mark.parametrize(
    ("moment", "whole"),
    [
        ("dumped stage", [(1, "ref_compute_log_prob"), (1, "actor_compute_log_prob")]),
        (
            "undumped stage",
            [(step, stage) for step in (1, 2) for stage in DUMPED if (step, stage) != (2, "actor_update")],
        ),
    ],
)
def test_sessions_finished_before_ctrl_c_are_whole(
    interrupted: Callable[[str], Interrupted], moment: str, whole: list[tuple[int, str]]
) -> None:
    run = interrupted(moment)
    dumped = sorted(path.parent for path in run.save_path.rglob("dump.json"))
    finished = sorted(session(run.save_path, step, stage) for step, stage in whole)
    assert [path for path in dumped if marker(path) is None] == finished
    for rank_dir in finished:
        assert entries(rank_dir)


@pytest.mark.parametrize(
    ("moment", "ran"),
    [
        ("dumped stage", [(1, stage) for stage in DEMO_STAGES]),
        ("undumped stage", [(1, stage) for stage in DEMO_STAGES] + [(2, stage) for stage in DEMO_STAGES[:4]]),
    ],
)
def test_the_timing_log_holds_every_stage_up_to_the_interrupted_one(
    interrupted: Callable[[str], Interrupted], moment: str, ran: list[tuple[int, str]]
) -> None:
    records = timing_records(interrupted(moment).save_path)
    assert records == [(step, stage, None) for step, stage in ran[:-1]] + [(*ran[-1], "KeyboardInterrupt")]


def test_ctrl_c_before_the_first_stage_leaves_nothing_that_blocks_a_rerun(
    interrupted: Callable[[str], Interrupted], tmp_path: Path
) -> None:
    run = interrupted("install")
    assert not list(run.save_path.glob("step_*")) and not (run.save_path / "run.json").exists()
    assert not list(run.save_path.glob("timing/*.jsonl"))
    result = check_save_path(tmp_path, run.save_path)
    assert result.returncode == 0, result.stderr
    assert "note:" not in result.stdout


def test_report_and_compare_name_the_session_cut_by_ctrl_c(interrupted: Callable[[str], Interrupted]) -> None:
    cut_run, whole_run = interrupted("dumped stage").save_path, interrupted("undumped stage").save_path
    cut = session(cut_run, 1, "actor_update")
    report = cli("report", str(cut_run))
    assert report.returncode == 0, report.stderr
    assert (
        f"warning: {cut} is an incomplete msprobe session: step 1 actor_update (rank 0) raised KeyboardInterrupt"
        in report.stderr
    )
    compare = cli("compare", str(cut_run), str(whole_run), "--step", "1", "--stage", "actor_update")
    assert compare.returncode == 2
    assert f"{cut} is an incomplete msprobe session" in compare.stderr
    assert "Traceback" not in report.stderr + compare.stderr
