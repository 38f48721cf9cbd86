"""``verl-events hangs``: two gloo ranks, one stuck; which rank is where, and the exit codes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

import verl_events
from verl_events.observers.watchdog import ABORT_EXIT_CODE, HangRecord
from verl_events.observers.watchdog.crash import ProcessEnd, ends_log_path
from verl_events.observers.watchdog.record import heartbeat_path

from .hang_support import DEADLINE, gloo_ranks, line_of, wait_for
from .support import verl_events_exe

__all__ = ["gloo_ranks"]  # the fixture, used here


def hangs_cli(run: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([verl_events_exe(), "hangs", str(run), *flags], capture_output=True, text=True, timeout=120)


def records(run: Path) -> list[HangRecord]:
    log = run / "hangs.jsonl"
    return [HangRecord.from_json(line) for line in log.read_text().splitlines()] if log.exists() else []


def stuck(run: Path, ranks: int) -> None:
    """Wait until ``ranks`` hang records are on disk (each watchdog fires once)."""
    wait_for(lambda: len([r for r in records(run) if r.kind == "hang"]) >= ranks, 60)


def positions(run: Path) -> tuple[dict[str, object], dict[int, dict[str, object]]]:
    result = hangs_cli(run, "--json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    return data, {p["rank"]: p for p in data["ranks"]}


@pytest.mark.slow
def test_a_rank_asleep_in_actor_update_and_one_waiting_in_its_all_reduce_are_named_with_their_lines(
    tmp_path: Path, gloo_ranks: object
) -> None:
    pytest.importorskip("torch")
    ranks = gloo_ranks(  # type: ignore[operator]
        """
        with verl_events.stage("actor_compute_log_prob", step=1):
            pass
        with verl_events.stage("actor_update", step=1):
            if rank == 1:
                time.sleep(12)
            dist.all_reduce(torch.ones(1))
        """
    )
    run, script = tmp_path / "run", tmp_path / "two_ranks.py"
    stuck(run, 2)
    for record in records(run):  # each fired within its deadline + 2 s
        assert DEADLINE <= record.time - record.began <= DEADLINE + 2
        assert str(record.collective).startswith("not available with gloo")  # no flight recorder there
    data, by_rank = positions(run)
    assert data["stuck"] == {"step": 1, "stage": "actor_update"}
    assert [by_rank[r]["state"] for r in (0, 1)] == ["inside", "inside"]
    asleep, waiting = by_rank[1]["where"], by_rank[0]["where"]
    assert (asleep["file"], asleep["line"], asleep["code"]) == (
        str(script),
        line_of(script, "time.sleep"),
        "time.sleep(12)",
    )  # type: ignore[index]
    assert (waiting["file"], waiting["line"]) == (str(script), line_of(script, "dist.all_reduce"))  # type: ignore[index]
    assert by_rank[0]["waiting_in"] == "torch.distributed.all_reduce" and by_rank[1]["waiting_in"] is None
    headline = "suspect: rank 1, not in a collective; rank 0 waits in all_reduce"
    assert data["suspect"] == {"ranks": [1], "line": headline}
    text = hangs_cli(run).stdout
    assert "inside actor_update: 2" in text and f"two_ranks.py:{line_of(script, 'time.sleep')}" in text
    assert text.splitlines()[2] == headline  # right under the HANG line
    for process in ranks:
        assert process.wait(timeout=60) == 0  # report only: training went on once rank 1 woke up
    late = [r for r in records(run) if r.kind == "late"]
    assert sorted(r.rank for r in late) == [0, 1] and all(r.elapsed_s >= DEADLINE for r in late)
    data, by_rank = positions(run)  # it ended late after all: still exit 1
    assert [by_rank[r]["state"] for r in (0, 1)] == ["finished", "finished"] and len(data["late"]) == 2
    assert data["suspect"] == {"ranks": [], "line": "suspect: none: every rank finished actor_update, late"}
    # ... and each rank still shows where it was when its deadline passed
    assert by_rank[1]["where"]["code"] == "time.sleep(12)"  # type: ignore[index]
    assert by_rank[0]["waiting_in"] == "torch.distributed.all_reduce"
    text = hangs_cli(run).stdout
    assert f"at its deadline: at {script}:{line_of(script, 'time.sleep')}" in text
    assert f"at its deadline: at {script}:{line_of(script, 'dist.all_reduce')}" in text


@pytest.mark.slow
def test_a_rank_stuck_in_the_stage_before_never_began_it_and_says_where_it_is(
    tmp_path: Path, gloo_ranks: object
) -> None:
    pytest.importorskip("torch")
    ranks = gloo_ranks(  # type: ignore[operator]
        """
        with verl_events.stage("actor_compute_log_prob", step=1):
            if rank == 1:
                time.sleep(12)
        with verl_events.stage("actor_update", step=1):
            dist.all_reduce(torch.ones(1))
        """
    )
    run, script = tmp_path / "run", tmp_path / "two_ranks.py"
    stuck(run, 2)
    data, by_rank = positions(run)
    assert data["stuck"] == {"step": 1, "stage": "actor_update"}
    assert by_rank[0]["state"] == "inside" and by_rank[0]["waiting_in"] == "torch.distributed.all_reduce"
    never = by_rank[1]
    assert (never["state"], never["stage"], never["step"]) == ("never_began", "actor_compute_log_prob", 1)
    assert never["where"]["line"] == line_of(script, "time.sleep")  # type: ignore[index]
    assert data["suspect"] == {
        "ranks": [1],
        "line": "suspect: rank 1, not in a collective, never began actor_update; rank 0 waits in all_reduce",
    }
    text = hangs_cli(run).stdout
    assert "never began it: 1" in text and "rank 1: inside actor_compute_log_prob (step 1)" in text
    for process in ranks:
        assert process.wait(timeout=60) == 0


@pytest.mark.slow
def test_action_abort_ends_both_ranks_with_the_documented_code_and_the_run_is_hung(
    tmp_path: Path, gloo_ranks: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 1 begins actor_update a second after rank 0, so rank 0's deadline passes first:
    had rank 1 ended first, rank 0's all-reduce would fail at once (gloo: the peer closed the
    connection) and its stage end with that error before its own deadline."""
    pytest.importorskip("torch")
    ranks = gloo_ranks(  # type: ignore[operator]
        """
        if rank == 1:
            time.sleep(1)
        with verl_events.stage("actor_update", step=1):
            if rank == 1:
                time.sleep(60)
            dist.all_reduce(torch.ones(1))
        """,
        action="abort",
    )
    run = tmp_path / "run"
    ended: dict[int, float] = {}
    give_up = time.monotonic() + 120
    while len(ended) < 2 and time.monotonic() < give_up:
        for rank, process in enumerate(ranks):
            if rank not in ended and process.poll() is not None:
                ended[rank] = time.time()
        time.sleep(0.05)
    assert [p.returncode for p in ranks] == [ABORT_EXIT_CODE, ABORT_EXIT_CODE], [p.communicate()[0] for p in ranks]
    began = {r.rank: r.began for r in records(run)}
    assert all(ended[rank] - began[rank] <= DEADLINE + 5 for rank in (0, 1))
    assert all(r.action == "abort" and r.kind == "hang" for r in records(run))
    data, by_rank = positions(run)  # the heartbeats stay where the ranks were
    assert [by_rank[r]["state"] for r in (0, 1)] == ["inside", "inside"]
    # Both processes closed their heartbeats as the watchdog ended them, so no reader takes them
    # for killed; each is judged by where it was at its deadline.
    assert [(by_rank[r]["closed"], by_rank[r]["liveness"]) for r in (0, 1)] == [(True, "closed")] * 2
    ends = [ProcessEnd.from_json(line) for line in ends_log_path(run).read_text().splitlines()]
    assert sorted((end.ranks, end.how) for end in ends) == [([0], "abort"), ([1], "abort")]
    from verl_events.apps.cli import main

    assert main(["diagnose", str(run), "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["verdict"] == "hung", verdict
    assert (verdict["first"]["rank"], verdict["first"]["kind"]) == (1, "hang")
    assert [(f["rank"], f["kind"]) for f in verdict["cascade"]] == [(0, "hang")]  # waiting in all_reduce
    headline = "suspect: rank 1, not in a collective; rank 0 waits in all_reduce"
    assert data["suspect"] == {"ranks": [1], "line": headline}
    # The text points on to diagnose, which tells what followed the ranks' end.
    assert main(["hangs", str(run)]) == 1
    assert f"a rank ended: verl-events diagnose {run} says what followed" in capsys.readouterr().out
    # examples/hang.py is this run with its own deadline: docs/hangs.md shows the same headline.
    assert f"\n{headline}\n" in (Path(__file__).resolve().parents[1] / "docs/hangs.md").read_text()


# -- bad input, in this process ---------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from verl_events.apps.cli import main

    code = main(["hangs", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_run_without_heartbeats_is_bad_input_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, str(tmp_path))
    assert code == 2 and "has no heartbeats" in err and "- name: watchdog" in err
    code, _, err = cli(capsys, str(tmp_path / "nowhere"))
    assert code == 2 and "does not exist" in err


def watched_run(save_path: Path, sleep: float = 0.0, timeout_s: float = 0.2) -> None:
    watchdog = {"name": "watchdog", "timeout_s": timeout_s, "heartbeat_s": 0.05}
    config = {"save_path": str(save_path), "observers": [watchdog]}
    with verl_events.install(config):
        with verl_events.stage("actor_update", step=1):
            time.sleep(sleep)


def test_a_healthy_run_exits_0_and_a_heartbeat_cut_short_is_skipped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    watched_run(tmp_path, timeout_s=30.0)  # healthy however busy the machine: far past the stage's time
    cut = heartbeat_path(tmp_path, 1)
    cut.write_text(heartbeat_path(tmp_path, 0).read_text()[:40])
    code, out, err = cli(capsys, str(tmp_path))
    assert code == 0 and "no deadline passed" in out
    assert f"warning: {cut} was skipped: it is not JSON" in err and "cut short" in err
    heartbeat_path(tmp_path, 0).write_text("")
    code, _, err = cli(capsys, str(tmp_path))
    assert code == 2 and "none of the 2 heartbeat(s)" in err


def test_a_stage_that_ended_late_still_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    watched_run(tmp_path, sleep=0.8)
    code, out, _ = cli(capsys, str(tmp_path))
    assert code == 1 and "ended late after all: rank 0, step 1 actor_update" in out
    code, out, _ = cli(capsys, str(tmp_path), "--json")
    data = json.loads(out)
    assert code == 1 and data["stuck"] == {"step": 1, "stage": "actor_update"} and len(data["late"]) == 1
    assert data["suspect"]["line"] == "suspect: none: every rank finished actor_update, late"


@pytest.mark.slow
def test_the_demo_with_the_watchdog_on_passes_no_deadline(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "watchdog.yaml").write_text(
        "save_path: run\nobservers:\n  - name: watchdog\n    floor_s: 5\n    first_s: 60\n  - name: timing\n"
    )
    demo = subprocess.run(
        [verl_events_exe(), "demo", "--config", "watchdog.yaml", "--nproc", "2", "--steps", "4"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    result = hangs_cli(tmp_path / "run")
    assert result.returncode == 0 and "no deadline passed" in result.stdout, result.stdout + result.stderr
    assert "rank 1: closed" in result.stdout
