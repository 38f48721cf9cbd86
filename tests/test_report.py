"""verl-events report on real demo output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_events.apps.cli import main
from verl_events.observers.timing import rank_bytes

STAGES = {
    "rollout_generate",
    "ref_compute_log_prob",
    "actor_compute_log_prob",
    "compute_values",
    "critic_update",
    "actor_update",
}


def report_json(capsys: pytest.CaptureFixture[str], run: Path, *args: str) -> dict:  # type: ignore[type-arg]
    assert main(["report", str(run), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_a_two_rank_run_reports_every_stage_of_every_step(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run = demo_runs["two_ranks"]
    result = report_json(capsys, run)
    assert result["ranks"] == [0, 1] and result["records"] == 2 * 3 * 6
    rows = result["stage_steps"]
    assert {(r["step"], r["stage"]) for r in rows} == {(s, st) for s in (1, 2, 3) for st in STAGES}
    for row in rows:
        assert row["ranks"] == 2 and row["spread"] >= 1.0 and row["slowest_rank"] in (0, 1)
        stage_dir = run / f"step_{row['step']}" / row["stage"]
        if row["profiled_by"]:
            assert row["profiled_by"] == ["msprobe"] and row["ratio"] > 0  # step 3 is the baseline
            assert row["dump_bytes"] == rank_bytes(stage_dir, 0) + rank_bytes(stage_dir, 1) > 0
        else:
            assert row["dump_bytes"] == 0 and row["ratio"] is None
    assert {o["stage"] for o in result["overhead"] if o["profiled_by"]} == {
        "actor_compute_log_prob",
        "ref_compute_log_prob",
        "actor_update",
    }


def test_the_table_shows_the_slowest_rank_with_several_ranks(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(demo_runs["two_ranks"])]) == 0
    out = capsys.readouterr().out
    assert "Stages by step" in out and "slowest" in out and "spread" in out and "rank" in out
    assert "Overhead per stage and tool" in out


def test_plot_writes_a_png(demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "overhead.png"
    assert main(["report", str(demo_runs["a"]), "--plot", str(plot), "--quiet"]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def test_trace_has_a_track_per_rank_and_hooks_inside_each_stage(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace_path = tmp_path / "trace.json"
    assert main(["report", str(demo_runs["two_ranks"]), "--trace", str(trace_path), "--quiet"]) == 0
    events = json.loads(trace_path.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert tracks == {"rank 0", "rank 1"}
    stages = [e for e in events if e["ph"] == "X" and e["name"] in STAGES]
    assert len(stages) == 36
    dumped = next(e for e in stages if e["name"] == "actor_update" and e["args"]["step"] == 1 and e["pid"] == 1)
    inside = [
        e
        for e in events
        if e["ph"] == "X"
        and e["pid"] == 1
        and e["name"] not in STAGES
        and dumped["ts"] <= e["ts"]
        and e["ts"] + e["dur"] <= dumped["ts"] + dumped["dur"] + 1
    ]
    assert [e["name"] for e in inside] == ["timing begin", "msprobe begin", "body", "msprobe end", "timing end"]


def test_a_run_without_timing_logs_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "has no timing logs" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def report_json_and_warnings(capsys: pytest.CaptureFixture[str], run: Path) -> tuple[dict, str]:  # type: ignore[type-arg]
    assert main(["report", str(run), "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def record(step: int, run: str = "r1") -> str:
    return json.dumps(
        {"run": run, "stage": "actor_update", "step": step, "rank": 0, "elapsed_s": 0.01 * step, "profiled": False}
    )


def write_log(run: Path, *lines: str, end: str = "\n") -> None:
    (run / "timing").mkdir(parents=True, exist_ok=True)
    (run / "timing/rank0.jsonl").write_text("\n".join(lines) + end)


def test_a_last_line_cut_short_is_skipped_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(tmp_path, record(1), record(2), '{"stage": "act', end="")
    result, warnings = report_json_and_warnings(capsys, tmp_path)
    assert result["records"] == 2
    assert "rank0.jsonl:3: the last line is cut short and was skipped" in warnings


def test_a_damaged_line_inside_a_log_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(tmp_path, record(1), "garbage", record(2))
    assert main(["report", str(tmp_path)]) == 2
    assert "rank0.jsonl:2 is not a JSON line" in capsys.readouterr().err


def test_lines_that_are_not_stage_records_are_skipped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_log(tmp_path, record(1), '{"event": "something else"}', "[1, 2]")
    result, warnings = report_json_and_warnings(capsys, tmp_path)
    assert result["records"] == 1
    assert "2 line(s) are not stage records of the timing observer and were skipped" in warnings


def test_a_log_holding_two_runs_is_reported_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(tmp_path, record(1, run="first"), record(1, run="second"))
    _, warnings = report_json_and_warnings(capsys, tmp_path)
    assert "the timing logs hold records of 2 runs (first, second); their figures are mixed" in warnings


def test_outputs_go_into_directories_that_do_not_exist_yet(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "new/deeper/trace.json"
    assert main(["report", str(demo_runs["a"]), "--trace", str(trace), "--quiet"]) == 0
    assert json.loads(trace.read_text())["traceEvents"]


def test_each_observers_own_hook_time_is_shown_per_stage(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result = report_json(capsys, demo_runs["a"])
    hooks = {(row["observer"], row["stage"]): row for row in result["observer_hooks"]}
    assert {stage for observer, stage in hooks if observer == "msprobe"} == {
        "actor_compute_log_prob",
        "ref_compute_log_prob",
        "actor_update",
    }
    assert {stage for observer, stage in hooks if observer == "timing"} == STAGES
    msprobe = hooks[("msprobe", "actor_update")]
    assert msprobe["n"] == 2 and 0 < msprobe["median_s"] <= msprobe["max_s"]
    assert main(["report", str(demo_runs["a"])]) == 0
    assert "Each observer's own hook time per stage" in capsys.readouterr().out


def test_an_incomplete_session_is_named(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(demo_runs["a"], cut)
    (cut / "step_1/actor_update/step0/rank0/session.incomplete").write_text(
        "cut off during step 1 actor_update (rank 0)\n"
    )
    _, warnings = report_json_and_warnings(capsys, cut)
    assert (
        "step_1/actor_update/step0/rank0 is an incomplete msprobe session: cut off during step 1 actor_update (rank 0)"
        in warnings
    )


def test_plot_without_matplotlib_names_the_extra(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without it gives
    assert main(["report", str(demo_runs["a"]), "--plot", str(tmp_path / "p.png"), "--quiet"]) == 2
    assert "--plot needs matplotlib: pip install 'verl-events[plot]'" in capsys.readouterr().err
