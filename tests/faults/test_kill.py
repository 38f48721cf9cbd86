"""kill -9 in the middle of a dumped stage.

The driver is killed inside step 1's actor_update after msprobe's periodic
save (every 1000 entries) has written a dump.json: a file that parses but
holds only part of the stage.  Only the session marker tells the readers so.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

import verl_events
from verl_events import ConfigError

from .processes import check_save_path, cli, driver, entries, marker, markers_under, session

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

CUT = "cut off during step 1 actor_update (rank 0)"


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    save_path = tmp_path_factory.mktemp("killed") / "run"
    child = driver(save_path, "--pause", "1:520")  # op 520: 1041 entries, past the periodic save
    child.wait_for("IN STAGE")
    os.kill(child.proc.pid, signal.SIGKILL)
    assert child.finish() == -signal.SIGKILL
    return save_path


def test_the_killed_session_is_marked_cut_off(killed: Path) -> None:
    assert marker(session(killed, 1, "actor_update")) == CUT
    assert markers_under(killed) == [session(killed, 1, "actor_update")]


def test_the_killed_sessions_periodic_save_is_a_prefix_of_the_whole_stage(killed: Path, whole_run: Path) -> None:
    cut = list(entries(session(killed, 1, "actor_update")))
    whole = list(entries(session(whole_run, 1, "actor_update")))
    assert 1000 <= len(cut) < len(whole)
    assert cut == whole[: len(cut)]


def test_a_stage_finished_before_the_kill_is_whole(killed: Path, whole_run: Path) -> None:
    finished = session(killed, 1, "actor_compute_log_prob")
    assert marker(finished) is None
    assert entries(finished).keys() == entries(session(whole_run, 1, "actor_compute_log_prob")).keys()
    result = cli("compare", str(killed), str(whole_run), "--step", "1", "--stage", "actor_compute_log_prob")
    assert result.returncode == 0, result.stderr
    assert "MATCH" in result.stdout


@pytest.mark.parametrize("killed_side", ["A", "B"])
def test_compare_refuses_the_killed_session_on_either_side(killed: Path, whole_run: Path, killed_side: str) -> None:
    a, b = (killed, whole_run) if killed_side == "A" else (whole_run, killed)
    result = cli("compare", str(a), str(b), "--step", "1", "--stage", "actor_update")
    assert result.returncode == 2
    assert f"{session(killed, 1, 'actor_update')} is an incomplete msprobe session" in result.stderr
    assert CUT in result.stderr
    assert "MATCH" not in result.stdout and "DIVERGED" not in result.stdout
    assert "Traceback" not in result.stderr


def test_report_reads_the_killed_run_and_names_the_cut_session(killed: Path) -> None:
    result = cli("report", str(killed), "--json")
    assert result.returncode == 0, result.stderr
    assert f"warning: {session(killed, 1, 'actor_update')} is an incomplete msprobe session: {CUT}" in result.stderr
    assert "Traceback" not in result.stderr
    # The two stages that ended before the kill, from the timing log.
    assert json.loads(result.stdout)["records"] == 2


def test_check_notes_the_cut_session(killed: Path, tmp_path: Path) -> None:
    result = check_save_path(tmp_path, killed)
    assert result.returncode == 0, result.stderr
    assert f"note: {session(killed, 1, 'actor_update')} is an incomplete msprobe session: {CUT}" in result.stdout


def test_a_new_run_into_the_killed_runs_save_path_is_refused(killed: Path) -> None:
    with pytest.raises(ConfigError, match=r"already holds 2 msprobe dump\(s\) from another run"):
        verl_events.install({"save_path": str(killed), "observers": [{"name": "msprobe"}]})
    assert markers_under(killed) == [session(killed, 1, "actor_update")]
