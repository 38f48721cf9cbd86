"""verl-events report's straggler view: scores, stragglers, hiccups and waiting ranks."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from verl_events.apps.cli import main
from verl_events.apps.read.overhead import read_timing_records
from verl_events.apps.report import report
from verl_events.apps.report.stragglers import MIN_EXCESS_S, NAMED, SLOW_SCORE, StageStragglers, stragglers
from verl_events.observers.timing import TimingRecord

from .report_support import assert_engines_agree
from .support import run_two_gloo_ranks, verl_events_exe


def record(stage: str, step: int, rank: int, seconds: float, end: float | None = None) -> TimingRecord:
    return TimingRecord(stage=stage, step=step, rank=rank, elapsed_s=seconds, profiled=False, end_unix=end)


def one_stage(records: list[TimingRecord]) -> StageStragglers:
    (row,) = stragglers(records)
    return row


def test_a_rank_three_times_slower_in_every_step_is_a_straggler_scored_3() -> None:
    row = one_stage(
        [record("actor_update", step, rank, 0.3 if rank == 1 else 0.1) for step in range(1, 7) for rank in (0, 1)]
    )
    (slow,) = row.slowest
    assert (slow.rank, slow.kind, slow.slow_steps, slow.steps) == (1, "straggler", 6, 6)
    assert slow.score == pytest.approx(3.0)
    assert (row.median_rank, row.straggler_ranks, row.hiccup_ranks) == (0, (1,), ())


def test_a_rank_slow_in_one_step_is_a_hiccup_at_that_step() -> None:
    records = [record("actor_update", s, r, 0.4 if (r, s) == (1, 4) else 0.1) for s in range(1, 7) for r in (0, 1)]
    (slow,) = one_stage(records).slowest
    assert (slow.rank, slow.kind, slow.slow_steps, slow.worst_step) == (1, "hiccup", 1, 4)
    assert slow.worst_ratio == pytest.approx(4.0) and slow.score == pytest.approx(1.0)


def test_a_rank_that_ended_with_the_others_waited_and_is_no_straggler() -> None:
    # Rank 0 began 0.2 s early (it was fast in the stage before) and both ended at once,
    # as ranks leaving one all-reduce do.
    records = [record("actor_update", s, r, 0.3 if r == 0 else 0.1, end=100.0 + s) for s in range(1, 5) for r in (0, 1)]
    row = one_stage(records)
    assert [(s.rank, s.kind, s.waited_steps, s.slow_steps) for s in row.slowest] == [(0, "waited", 4, 0)]
    assert row.straggler_ranks == () and row.waited_ranks == (0,)


def test_a_slowdown_of_under_the_excess_floor_is_not_slow() -> None:
    seconds = MIN_EXCESS_S / 4  # rank 1 takes three times as long: half the floor more
    records = [record("ref", s, r, seconds * (3 if r == 1 else 1)) for s in range(1, 7) for r in (0, 1)]
    (slow,) = one_stage(records).slowest
    assert slow.kind == "-" and slow.score == pytest.approx(3.0)


def test_a_thousand_ranks_name_the_three_slowest_and_list_every_straggler() -> None:
    slow_ranks = {7: 2.0, 500: 3.0, 990: 2.5, 123: 1.8}
    records = [
        record("actor_update", step, rank, 0.1 * slow_ranks.get(rank, 1.0 + rank * 1e-5))
        for rank in range(1000)
        for step in range(1, 11)
    ]
    row = one_stage(records)
    assert [s.rank for s in row.slowest] == [500, 990, 7][:NAMED]
    assert set(row.straggler_ranks) == set(slow_ranks) and row.ranks == 1000
    assert row.median_rank not in slow_ranks and row.median_rank_s == pytest.approx(0.1, rel=0.01)


def test_a_stage_of_one_rank_has_no_straggler_row() -> None:
    assert stragglers([record("actor_update", s, 0, 0.1) for s in range(1, 4)]) == []


def test_profiled_records_are_left_out_where_the_stage_has_unprofiled_ones() -> None:
    records = [record("actor_update", s, r, 0.1) for s in range(1, 7) for r in (0, 1)]
    records += [  # msprobe on rank 1 only, steps 7 and 8: the tool's slowness, not the rank's
        TimingRecord(stage="actor_update", step=s, rank=r, elapsed_s=0.9 if r else 0.1, profiled=bool(r))
        for s in (7, 8)
        for r in (0, 1)
    ]
    row = one_stage(records)
    assert row.straggler_ranks == () and row.slowest == ()


# Two real gloo ranks: rank 1's body of actor_compute_log_prob sleeps three times as long,
# in every step (straggler), in step 3 only (hiccup) or never (healthy); actor_update ends
# in an all-reduce, where rank 0 waits for rank 1.
TWO_RANKS = """
    import time
    import torch
    import verl_events
    from verl_events import emits_stage

    class Worker:
        def __init__(self, slow_steps):
            self.slow_steps = slow_steps

        @emits_stage("actor_compute_log_prob")
        def compute_log_prob(self, data):
            slow = rank == 1 and data["global_steps"] in self.slow_steps
            time.sleep(0.3 if slow else 0.1)

        @emits_stage("actor_update")
        def update_actor(self, data):
            grad = torch.ones(4)
            dist.all_reduce(grad)

    for scenario, slow_steps in (("straggler", range(1, 7)), ("hiccup", [3]), ("healthy", [])):
        worker = Worker(set(slow_steps))
        with verl_events.install({"save_path": scenario, "observers": [{"name": "timing"}]}):
            for step in range(1, 7):
                worker.compute_log_prob({"global_steps": step})
                worker.update_actor({"global_steps": step})
        dist.barrier()
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    directory = tmp_path_factory.mktemp("stragglers")
    result = run_two_gloo_ranks(directory, TWO_RANKS, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return directory


def straggling(run: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    """The report's straggler rows of ``run``, which DuckDB's engine gives alike (when installed)."""
    text = report(run, console=Console(file=io.StringIO()), as_json_output=True, quiet=True, engine="records")
    assert text is not None
    if importlib.util.find_spec("duckdb") is not None:
        assert_engines_agree(run)
    return {row["stage"]: row for row in json.loads(text)["stragglers"]}


@pytest.mark.slow
def test_two_gloo_ranks_rank_1_three_times_slower_is_named_a_straggler(two_rank_runs: Path) -> None:
    rows = straggling(two_rank_runs / "straggler")
    slow = rows["actor_compute_log_prob"]
    assert slow["straggler_ranks"] == [1] and slow["hiccup_ranks"] == []
    assert slow["slowest"][0]["rank"] == 1 and slow["slowest"][0]["score"] > 2.0  # 3x, less scheduling noise
    # Rank 0 spends those seconds waiting in actor_update's all-reduce: named so, not a straggler.
    assert rows["actor_update"]["straggler_ranks"] == [] and rows["actor_update"]["waited_ranks"] == [0]


@pytest.mark.slow
def test_two_gloo_ranks_rank_1_slow_once_is_named_a_hiccup(two_rank_runs: Path) -> None:
    slow = straggling(two_rank_runs / "hiccup")["actor_compute_log_prob"]
    assert slow["hiccup_ranks"] == [1] and slow["straggler_ranks"] == []
    (named,) = [s for s in slow["slowest"] if s["kind"] == "hiccup"]
    assert (named["rank"], named["worst_step"], named["slow_steps"]) == (1, 3, 1)


@pytest.mark.slow
def test_two_healthy_gloo_ranks_name_no_straggler(two_rank_runs: Path) -> None:
    # Hiccups are not asserted: a loaded machine may well stall a rank 50 ms once.
    rows = straggling(two_rank_runs / "healthy")
    assert rows and all(row["straggler_ranks"] == [] for row in rows.values())


@pytest.mark.slow
def test_the_table_names_the_straggler_and_its_stage(
    two_rank_runs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["report", str(two_rank_runs / "straggler"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "Slowest ranks per stage" in out
    assert "actor_compute_log_prob: 1 straggler: rank 1 (of 2 ranks)" in out
    assert "actor_update: rank 0 waited for others (of 2 ranks)" in out


@pytest.mark.slow
def test_the_healthy_two_rank_demo_names_no_straggler(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the demo trains with torch
    run = tmp_path / "demo"
    result = subprocess.run(
        [verl_events_exe(), "demo", "--nproc", "2", "--steps", "6", "--save-path", str(run)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = straggling(run)
    assert len(rows) == 6 and all(row["straggler_ranks"] == [] for row in rows.values())


def test_a_one_rank_run_shows_no_straggler_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "timing").mkdir()
    lines = [record("actor_update", s, 0, 0.1).to_json() for s in range(1, 4)]
    (tmp_path / "timing" / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(tmp_path), "--quiet"]) == 0
    assert "Slowest ranks" not in capsys.readouterr().out
    assert main(["report", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stragglers"] == []


PEER_RAISES = """\
import os, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, {repo!r})
import verl_events

rank = int(sys.argv[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=rank, world_size=2)
try:
    with verl_events.install({{"save_path": {save_path!r}, "observers": [{{"name": "timing"}}]}}):
        for step in (1, 2, 3, 4):
            with verl_events.stage("actor_update", step=step):
                time.sleep(0.02)
                if step == 3 and rank == 1:
                    time.sleep(0.3)
                    raise RuntimeError("rank 1 fails in step 3")
                dist.all_reduce(torch.ones(1))
finally:
    time.sleep(0.5)  # a failing process takes a while to go (here at least 0.5 s), and its peer waits
"""


@pytest.mark.slow
def test_the_rank_whose_peer_raised_waited_and_had_no_hiccup(tmp_path: Path) -> None:
    """Rank 1 raises in step 3 before the all-reduce; rank 0 waits in it until gloo tells it
    the peer's process is gone, and so takes longer than rank 1 by far: that is waiting, not a hiccup."""
    pytest.importorskip("torch")  # the ranks join with torch.distributed (gloo)
    from .support import end_processes, start_rank_pair

    script, run = tmp_path / "rank.py", tmp_path / "run"
    script.write_text(PEER_RAISES.format(repo=str(Path(__file__).resolve().parents[1]), save_path=str(run)))
    processes = start_rank_pair(script, "peer-raises")
    try:
        for process in processes:
            process.communicate(timeout=120)
    finally:
        end_processes(processes)
    records = read_timing_records(run)
    errors = {(r.rank, r.step): r.error for r in records if r.error is not None}
    assert errors.get((1, 3)) == "RuntimeError", errors  # the run went as planned
    waiting = next(r for r in records if (r.rank, r.step) == (0, 3))
    failed = next(r for r in records if (r.rank, r.step) == (1, 3))
    assert waiting.elapsed_s >= max(SLOW_SCORE * failed.elapsed_s, failed.elapsed_s + MIN_EXCESS_S)
    (row,) = stragglers(records)  # the raw logs, as diagnose reads them
    assert 0 not in row.hiccup_ranks + row.straggler_ranks
    assert all(score.slow_steps == 0 for score in row.slowest if score.rank == 0)
