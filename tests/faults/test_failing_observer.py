"""An observer that fails in every hook (``fault_observers:AlwaysFails``,
loaded by ``_target_``), beside msprobe and timing, with max_failures 3."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from .processes import driver, entries, log_records, marker, session, timing_lines

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

NAME = "fault_observers:AlwaysFails"
FAILURE = re.compile(rf"ERROR verl_events: observer '{NAME}' failed in (\w+) for stage '(\w+)' \(step (\d+), rank 0\)")


@dataclass(frozen=True)
class Run:
    save_path: Path
    returncode: int
    stdout: str
    records: list[str]  # stderr's log records

    def failures(self) -> list[str]:
        return [r for r in self.records if FAILURE.match(r)]


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Run:
    save_path = tmp_path_factory.mktemp("failing") / "run"
    child = driver(save_path, "--failing")
    returncode = child.finish()
    return Run(save_path, returncode, child.stdout, log_records(child.stderr))


def test_training_finishes_with_an_observer_failing_in_every_hook(failing: Run) -> None:
    assert failing.returncode == 0, "\n".join(failing.records)
    assert failing.stdout.endswith("TRAINING FINISHED\n")


def test_the_first_failure_carries_a_traceback_and_repeats_are_one_line(failing: Run) -> None:
    first, *repeats = failing.failures()
    assert "Traceback (most recent call last)" in first
    assert first.rstrip().endswith("RuntimeError: begin of actor_compute_log_prob step 1 broke")
    assert repeats
    for count, record in enumerate(repeats, start=2):
        assert "\n" not in record
        assert record.endswith(f"(failure {count})")


def test_the_observer_is_switched_off_after_max_failures_and_still_gets_the_end_it_is_owed(failing: Run) -> None:
    hooks = [FAILURE.match(r).groups() for r in failing.failures()]  # type: ignore[union-attr]
    assert hooks == [
        ("on_stage_begin", "actor_compute_log_prob", "1"),
        ("on_stage_end", "actor_compute_log_prob", "1"),
        ("on_stage_begin", "compute_values", "1"),  # the third: switched off here
        ("on_stage_end", "compute_values", "1"),  # owed for the begin it got
    ]
    switched_off = [r for r in failing.records if "switched off" in r]
    assert switched_off == [
        f"ERROR verl_events: observer '{NAME}' failed 3 times; it is switched off for the rest of this run "
        "(raise max_failures, or set it to null, to keep it on)"
    ]
    third = failing.failures()[2]
    assert failing.records.index(switched_off[0]) == failing.records.index(third) + 1


def test_a_failing_close_is_logged_once(failing: Run) -> None:
    closes = [r for r in failing.records if f"observer '{NAME}' failed to close" in r]
    assert len(closes) == 1
    assert closes[0].rstrip().endswith("RuntimeError: close broke")


def test_the_other_observers_outputs_are_complete(failing: Run, whole_run: Path) -> None:
    for step in (1, 2):
        for stage in ("actor_compute_log_prob", "actor_update"):
            rank_dir = session(failing.save_path, step, stage)
            assert marker(rank_dir) is None
            assert entries(rank_dir).keys() == entries(session(whole_run, step, stage)).keys()
    assert len(timing_lines(failing.save_path)) == 2 * 3
