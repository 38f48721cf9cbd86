"""A stage body that raises: step 1's actor_update raises ``Boom`` half-way
(551 msprobe entries in), the driver's loop catches it and trains on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from .processes import cli, driver, entries, marker, markers_under, session, timing_lines

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

RAISED = "step 1 actor_update (rank 0) raised Boom; the dump holds the stage only up to there"


@dataclass(frozen=True)
class Run:
    save_path: Path
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def raised(tmp_path_factory: pytest.TempPathFactory) -> Run:
    save_path = tmp_path_factory.mktemp("raised") / "run"
    child = driver(save_path, "--raise-at", "1")
    return Run(save_path, child.finish(), child.stdout, child.stderr)


def test_the_stage_bodys_exception_reaches_the_caller_unchanged(raised: Run) -> None:
    assert raised.returncode == 0, raised.stderr
    assert "CAUGHT the raised object: the body of step 1 actor_update raised\n" in raised.stdout
    assert raised.stdout.endswith("TRAINING FINISHED\n")
    assert raised.stderr == ""  # no observer failed, nothing was logged


def test_the_raising_stages_session_is_closed_and_marked_raised(raised: Run, whole_run: Path) -> None:
    rank_dir = session(raised.save_path, 1, "actor_update")
    assert marker(rank_dir) == RAISED
    assert markers_under(raised.save_path) == [rank_dir]
    upto = list(entries(rank_dir))
    whole = list(entries(session(whole_run, 1, "actor_update")))
    assert 0 < len(upto) < len(whole) and upto == whole[: len(upto)]


def test_the_next_stage_dumps_normally(raised: Run, whole_run: Path) -> None:
    for step, stage in [(2, "actor_compute_log_prob"), (2, "actor_update")]:
        rank_dir = session(raised.save_path, step, stage)
        assert marker(rank_dir) is None
        assert entries(rank_dir).keys() == entries(session(whole_run, step, stage)).keys()


def test_the_timing_log_records_the_error_of_the_raising_stage(raised: Run) -> None:
    records = [(r["step"], r["stage"], r["error"]) for r in map(json.loads, timing_lines(raised.save_path))]
    assert records == [
        (1, "actor_compute_log_prob", None),
        (1, "compute_values", None),
        (1, "actor_update", "Boom"),
        (2, "actor_compute_log_prob", None),
        (2, "compute_values", None),
        (2, "actor_update", None),
    ]


def test_readers_name_the_raising_stage_as_incomplete(raised: Run, whole_run: Path) -> None:
    rank_dir = session(raised.save_path, 1, "actor_update")
    compare = cli("compare", str(raised.save_path), str(whole_run), "--step", "1", "--stage", "actor_update")
    assert compare.returncode == 2
    assert f"{rank_dir} is an incomplete msprobe session, not a whole stage: {RAISED}" in compare.stderr
    report = cli("report", str(raised.save_path))
    assert report.returncode == 0, report.stderr
    assert f"warning: {rank_dir} is an incomplete msprobe session: {RAISED}" in report.stderr
    assert "Traceback" not in compare.stderr + report.stderr
