"""A run's identity: what every process of one run agrees on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_events.layout import RUN_FILE, SavePathTaken, claim_save_path, owner_of, refuse_other_runs, run_id


@pytest.fixture(autouse=True)
def no_inherited_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VERL_EVENTS_RUN_ID", "TORCHELASTIC_RUN_ID", "MASTER_PORT", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.slow
def test_in_ray_the_session_and_job_name_the_run() -> None:
    """Every fresh local Ray cluster numbers its first job 01000000: the job id alone repeats."""
    pytest.importorskip("ray")
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        context = ray.get_runtime_context()
        assert run_id() == f"ray-{context.get_session_name()}-{context.get_job_id()}"
    finally:
        ray.shutdown()


def test_a_launchers_id_wins_over_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "nightly-42")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert run_id() == "nightly-42"


def test_torchruns_rendezvous_id_names_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert run_id() == "torchrun-abc"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default --rdzv-id
    assert run_id() == f"torchrun-agent{os.getppid()}"


def test_ranks_started_by_one_parent_share_the_parent_and_the_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    made = run_id()  # before torch.distributed is set up: made up here
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29511")
    assert run_id() == f"ranks-{os.getppid()}-127.0.0.1-29511" != made
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "named")  # a launcher's name wins
    assert run_id() == "named"


def test_the_ranks_id_is_a_file_name_safe_on_every_filesystem(monkeypatch: pytest.MonkeyPatch) -> None:
    """It names the run's folder (save_path: .../{run}): no colon, no slash, even for an IPv6 rendezvous."""
    monkeypatch.setenv("MASTER_ADDR", "fe80::1%eth0")
    monkeypatch.setenv("MASTER_PORT", "29511")
    assert run_id() == f"ranks-{os.getppid()}-fe80--1-eth0-29511"
    monkeypatch.setenv("MASTER_PORT", "29512")  # another launch beside it: another folder
    assert run_id() == f"ranks-{os.getppid()}-fe80--1-eth0-29512"


def test_a_made_up_id_is_inherited_by_the_processes_this_one_starts() -> None:
    mine = run_id()
    assert mine.startswith("run-") and run_id() == mine
    child = subprocess.run(
        [sys.executable, "-c", "from verl_events.layout import run_id; print(run_id())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == mine


def test_files_of_another_run_are_refused_and_this_runs_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "a")
    claim_save_path(tmp_path, [])
    dump = tmp_path / "step_1/actor_update/step0/rank0"
    refuse_other_runs(tmp_path, [dump], "dumps")  # this run's own files
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "b")
    with pytest.raises(SavePathTaken, match=r"already holds 1 dumps from another run \(run 'a'; this is run 'b'\)"):
        refuse_other_runs(tmp_path, [dump], "dumps")
    (tmp_path / RUN_FILE).unlink()
    with pytest.raises(SavePathTaken, match=r"from another run \(a run that left no run.json; this is run 'b'\)"):
        refuse_other_runs(tmp_path, [dump], "dumps")


def test_a_stale_claim_is_replaced_and_an_unreadable_one_names_no_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stale: made before this process started, by a run that wrote nothing here."""
    (tmp_path / RUN_FILE).write_text('{"run_id": "old"}')
    os.utime(tmp_path / RUN_FILE, (1_000_000_000, 1_000_000_000))
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "new")
    claim_save_path(tmp_path, [])
    assert owner_of(tmp_path) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [RUN_FILE]  # nothing left aside
    (tmp_path / RUN_FILE).write_text("{cut sh")
    assert owner_of(tmp_path) is None


def test_the_first_claim_wins_over_a_run_started_beside_it_or_holding_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "first")
    claim_save_path(tmp_path, [])
    monkeypatch.setenv("VERL_EVENTS_RUN_ID", "second")
    with pytest.raises(SavePathTaken, match=r"is taken by run 'first' .*; this is run 'second'"):
        claim_save_path(tmp_path, [])  # claimed since this process started: a run beside it
    os.utime(tmp_path / RUN_FILE, (1_000_000_000, 1_000_000_000))
    with pytest.raises(SavePathTaken, match=r"is taken by run 'first'"):
        claim_save_path(tmp_path, [tmp_path / "timing/rank0.jsonl"])  # an old claim, but its files are there
    assert owner_of(tmp_path) == "first"
