"""verl-events report on real demo output."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest

import verl_events
from verl_events import STAGE_ROLES
from verl_events.apps.cli import main
from verl_events.observers.timing import rank_bytes

from .support import run_steps, verl_events_exe
from .terminal import run_in_terminal

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
    for step in (1, 2, 3):  # each stage's share of its step: body and hooks over the step's sum
        in_step = [r for r in rows if r["step"] == step]
        total = sum(r["body_s"] + r["hooks_s"] for r in in_step)
        for row in in_step:
            assert row["step_share"] == pytest.approx((row["body_s"] + row["hooks_s"]) / total)


def test_the_table_shows_the_slowest_rank_with_several_ranks(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(demo_runs["two_ranks"])]) == 0
    out = capsys.readouterr().out
    assert "Stages by step" in out and "slowest" in out and "spread" in out and "rank" in out and "% step" in out
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
    assert f"{tmp_path / 'nope'} does not exist; pass the save_path of a run" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    assert main(["report", str(tmp_path / "a-file")]) == 2
    assert f"{tmp_path / 'a-file'} is not a directory; pass the save_path of a run" in capsys.readouterr().err


def test_a_stage_that_raised_is_counted_and_kept_out_of_every_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three healthy actor_updates and one that raised after 200 ms: the report counts the
    failure (type, step, rank) and its medians, tables and hook times are of the three."""
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "timing"}]}):
        run_steps(range(1, 4), ("actor_update",))
        with pytest.raises(RuntimeError, match="peer died"), verl_events.stage("actor_update", step=4):
            time.sleep(0.2)
            raise RuntimeError("peer died")
    result = report_json(capsys, tmp_path, "--trace", str(tmp_path / "trace.json"))
    assert result["records"] == 4
    assert result["raised"] == [
        {"stage": "actor_update", "n": 1, "errors": {"RuntimeError": 1}, "steps": [4], "ranks": [0]}
    ]
    (overhead,) = result["overhead"]
    assert overhead["unprofiled_n"] == 3 and overhead["unprofiled_high_s"] < 0.1  # not the 200 ms
    assert [row["step"] for row in result["stage_steps"]] == [1, 2, 3]
    assert [row["n"] for row in result["observer_hooks"]] == [3]
    slices = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    failed = [e for e in slices if e["name"] == "actor_update" and e["args"].get("error")]
    assert [(e["args"]["step"], e["args"]["error"]) for e in failed] == [(4, "RuntimeError")]  # the timeline keeps it

    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Stages that raised" in out
    row = next(line for line in out.splitlines() if "RuntimeError x1" in line)
    assert re.search(r"actor_update\s*│\s*1\s*│\s*RuntimeError x1\s*│\s*4\s*│\s*0\b", row), row


def test_a_run_where_no_stage_raised_shows_no_raised_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(tmp_path, *SPREAD_LOG)
    assert report_json(capsys, tmp_path)["raised"] == []
    assert main(["report", str(tmp_path)]) == 0
    assert "raised" not in capsys.readouterr().out


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
    assert (
        "--plot needs matplotlib: pip install matplotlib (or, in a checkout of verl-events, pip install -e '.[plot]')"
        in capsys.readouterr().err
    )


def test_the_plot_labels_each_ratio_as_the_table_prints_it(demo_runs: dict[str, Path]) -> None:
    from verl_events.apps.read.overhead import overhead_table, read_timing_records
    from verl_events.apps.report.plot import TOO_FEW, overhead_figure, ratio_label

    rows = overhead_table(read_timing_records(demo_runs["two_ranks"]), STAGE_ROLES)
    figure = overhead_figure(rows)
    times, disk = figure.axes
    labels = sorted(text.get_text() for text in times.texts)
    expected = sorted(label for label in map(ratio_label, rows) if label is not None)
    assert labels == expected and len(labels) == 3  # the three stages msprobe profiled
    # msprobe on steps 1-2 of 3: a baseline of 2 records a stage, each ratio too few to trust
    assert all(label.endswith("x*") for label in labels)
    assert TOO_FEW in [text.get_text() for text in figure.texts]
    assert disk.get_ylim()[0] == 0 and disk.get_ylim()[1] > max(r.dump_bytes_per_step for r in rows) / 1e6


def test_a_plot_of_a_run_nothing_profiled_has_no_disk_panel(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from verl_events.apps.read.overhead import overhead_table, read_timing_records
    from verl_events.apps.report.plot import overhead_figure

    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "timing"}]}):
        run_steps(range(1, 5), ("actor_compute_log_prob", "actor_update"))
    figure = overhead_figure(overhead_table(read_timing_records(tmp_path)))
    (times,) = figure.axes  # one panel: nothing was dumped, so no MB axis at all
    assert list(times.texts) == [] and list(figure.texts) == []  # no ratio, and 4 records a stage: no mark
    assert times.get_ylim()[0] >= 0


def timed(step: int, elapsed: float, hooks: float = 0.0) -> str:
    """A stage record of actor_update; profiled by msprobe when ``hooks``."""
    profiled = hooks > 0
    return json.dumps(
        {
            "stage": "actor_update",
            "step": step,
            "rank": 0,
            "elapsed_s": elapsed,
            "overhead_s": hooks,
            "profiled": profiled,
            "profiled_by": ["msprobe"] if profiled else [],
        }
    )


# Unprofiled 1..4 ms and 9 ms (median 3, IQR 2-4); profiled 5 and 7 ms plus 1 ms of hooks each.
SPREAD_LOG = [timed(s, t / 1e3) for s, t in enumerate([1.0, 2.0, 3.0, 4.0, 9.0], 3)] + [
    timed(1, 0.005, 0.001),
    timed(2, 0.007, 0.001),
]


def overhead_text(tmp_path: Path, width: int) -> str:
    """The overhead table of SPREAD_LOG as a console ``width`` columns wide prints it."""
    import io

    from rich.console import Console

    from verl_events.apps.read.overhead import overhead_table, read_timing_records
    from verl_events.apps.report import render_overhead

    write_log(tmp_path, *SPREAD_LOG)
    console = Console(file=io.StringIO(), width=width)
    render_overhead(overhead_table(read_timing_records(tmp_path)), console)
    return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]


def test_each_median_in_the_table_shows_its_count_and_spread(tmp_path: Path) -> None:
    text = overhead_text(tmp_path, width=200)
    assert "3.0 (n=5, IQR 2.0-4.0)" in text  # unprofiled
    assert "7.0* (n=2, range 6.0-8.0)" in text  # profiled: body plus hooks
    assert "2.33x*" in text
    assert (
        "n: records over all ranks and steps; IQR: interquartile range (n >= 4); range: minimum to maximum (n < 4)"
        in text
    )
    assert "* fewer than 3 records (a ratio: on either side): too few to trust" in text


def test_a_narrow_console_gets_the_spread_on_a_second_line(tmp_path: Path) -> None:
    lines = overhead_text(tmp_path, width=112).splitlines()  # the one-line table needs 130
    assert all(len(line) <= 112 for line in lines)
    row = next(i for i, line in enumerate(lines) if "actor_update" in line)
    assert "3.0 (n=5)" in lines[row] and "7.0* (n=2)" in lines[row]
    assert "IQR 2.0-4.0" in lines[row + 1] and "range 6.0-8.0" in lines[row + 1]


def test_the_report_marks_figures_of_too_few_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(tmp_path, *SPREAD_LOG)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "7.0* (n=2)" in out and "2.33x*" in out and "* fewer than 3 records" in out


def test_json_gives_each_median_its_count_spread_and_trust(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(tmp_path, *SPREAD_LOG)
    [row] = report_json(capsys, tmp_path)["overhead"]
    assert row["unprofiled_s"] == 0.003 and row["unprofiled_n"] == 5  # the keys that were there keep their meaning
    assert (row["unprofiled_spread"], row["unprofiled_low_s"], row["unprofiled_high_s"]) == ("iqr", 0.002, 0.004)
    assert (row["profiled_spread"], row["profiled_low_s"], row["profiled_high_s"]) == ("min-max", 0.006, 0.008)
    assert (row["unprofiled_too_few"], row["profiled_too_few"], row["ratio_too_few"]) == (False, True, True)
    assert row["profiled_first_s"] == 0.006  # step 1, the first profiled call: warm-up shows here


def test_a_two_rank_run_gives_every_overhead_median_its_spread(
    demo_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result = report_json(capsys, demo_runs["two_ranks"])
    for row in result["overhead"]:
        # Step 3 of 3 on two ranks is the baseline: two records, too few; steps 1-2 profiled: four, the IQR.
        assert (row["unprofiled_n"], row["unprofiled_spread"], row["unprofiled_too_few"]) in [
            (2, "min-max", True),
            (6, "iqr", False),
        ]
        assert row["unprofiled_low_s"] <= row["unprofiled_s"] <= row["unprofiled_high_s"]
        if row["profiled_by"]:
            assert (row["profiled_n"], row["profiled_spread"], row["profiled_too_few"]) == (4, "iqr", False)
            assert row["profiled_low_s"] <= row["profiled_s"] <= row["profiled_high_s"]
            assert row["ratio_too_few"]
    steps = {(r["stage"], r["step"]): r for r in result["stage_steps"]}
    assert steps[("actor_update", 1)]["baseline_n"] == 2


TITLES = ("Stages by step", "Overhead per stage and tool", "Each observer's own hook time per stage")
CAPTURE = "tests.support:Capturing"  # the second observer's name: a long one


def tables(text: str) -> dict[str, str]:
    """The report's text, cut into its three tables by their titles."""
    starts = [text.index(title) for title in TITLES]
    return {title: text[start:end] for title, start, end in zip(TITLES, starts, [*starts[1:], len(text)], strict=True)}


def assert_names_whole(text: str, stages: list[str], profiler: str) -> None:
    """Every name on one line of each table, uncut (rich ends a cut name with "…"):
    the stages, the profiling observer, and in the hook times the timing observer too."""
    assert "…" not in text, text
    for title, table in tables(text).items():
        for name in [*stages, profiler, *(["timing"] if title == TITLES[-1] else [])]:
            assert re.search(rf"(?<![\w.:]){re.escape(name)}(?![\w.:])", table), f"{name} is cut in {title!r}:\n{table}"


def test_a_narrow_console_cuts_no_stage_or_observer_name_in_any_table(tmp_path: Path) -> None:
    """Stages of verl's, a timing log of a real run, the other observer capturing steps 1 and 2."""
    from rich.console import Console

    from verl_events.apps.report import report

    stages = [s for s in STAGE_ROLES if s not in ("train_batch", "forward_backward")]
    config = {"save_path": str(tmp_path), "observers": [{"name": "timing"}, {"_target_": CAPTURE, "steps": [1, 2]}]}
    with verl_events.install(config):
        run_steps(range(1, 5), tuple(stages))
    for width in (40, 60, 80):
        console = Console(file=io.StringIO(), width=width)
        report(tmp_path, console=console)
        assert_names_whole(console.file.getvalue(), stages, CAPTURE)  # type: ignore[attr-defined]


def test_report_in_a_60_column_terminal_cuts_no_name(demo_runs: dict[str, Path]) -> None:
    """The command on a two-rank demo run, in a terminal window 60 columns wide."""
    status, out = run_in_terminal([verl_events_exe(), "report", str(demo_runs["two_ranks"])], columns=60, timeout=120)
    assert status == 0, out
    assert_names_whole(out, sorted(STAGES), "msprobe")
    notes = [line for line in out.splitlines() if line.startswith("n: records")]
    assert notes and len(notes[0]) <= 60  # the text around the tables keeps to the window


def test_the_report_opens_with_a_headline_of_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "timing"}]}):
        for step in (1, 2, 3):
            for name, seconds in (("actor_compute_log_prob", 0.001), ("actor_update", 0.02)):
                with verl_events.stage(name, step=step):
                    time.sleep(seconds)
    lines = [json.loads(line) for line in (tmp_path / "timing" / "rank0.jsonl").read_text().splitlines()]
    per_stage: dict[str, float] = {}
    for line in lines:
        per_stage[line["stage"]] = per_stage.get(line["stage"], 0.0) + line["elapsed_s"] + sum(line["hook_s"].values())
    slowest = max(per_stage, key=per_stage.__getitem__)
    head = report_json(capsys, tmp_path)["headline"]
    assert (head["run"], head["ranks"], head["steps"], head["slowest_stage"]) == (lines[0]["run"], 1, 3, slowest)
    assert head["stage_s"] == pytest.approx(sum(per_stage.values()))
    assert head["slowest_share"] == pytest.approx(per_stage[slowest] / sum(per_stage.values()))
    assert 0 < head["run_share"] <= 1 and 0 < head["hooks_share"] < 1
    assert main(["report", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    share = f"{head['slowest_share']:.0%}"
    assert first.startswith(f"run {lines[0]['run']}: 1 rank, 3 steps; stage time {head['stage_s']:.2f} s (")
    assert f"the slowest stage {slowest} {share} of it; observers' hooks {head['hooks_share']:.1%}" in first


@pytest.mark.parametrize("engine", ["records", "duckdb"])
def test_the_headline_counts_training_steps_and_the_driver_apart_from_the_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    """verl syncs the starting weights as step 0 and its driver waits for generation on a rank of
    its own: a 2-step run of one rank says "1 rank and the driver, 2 steps"."""
    if engine == "duckdb":
        pytest.importorskip("duckdb")
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "timing"}]}):
        with verl_events.stage("update_weights", step=0):
            pass
        for step in (1, 2):
            with verl_events.stage("rollout_generate", step=step, rank=verl_events.DRIVER_RANK):
                pass
            for name in ("actor_update", "update_weights"):
                with verl_events.stage(name, step=step):
                    pass
    head = report_json(capsys, tmp_path, "--engine", engine)["headline"]
    assert (head["ranks"], head["driver"], head["steps"]) == (1, True, 2)
    assert main(["report", str(tmp_path), "--engine", engine]) == 0
    assert ": 1 rank and the driver, 2 steps;" in capsys.readouterr().out.splitlines()[0]


def test_a_long_run_folds_the_stages_by_step_table_and_only_prints_one_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """20 steps, the slowest step 12: the table shows step 1, the three slowest (12 among them)
    and the last two, and names the others as ranges; --all-steps shows all; --only prints one section;
    --json keeps every row."""
    run = tmp_path / "run"
    observers = [{"name": "timing"}, {"name": "memory"}]
    with verl_events.install({"save_path": str(run), "observers": observers}):
        for step in range(1, 21):
            with verl_events.stage("actor_update", step=step):
                time.sleep(0.05 if step == 12 else 0.001)
    assert main(["report", str(run)]) == 0
    folded = capsys.readouterr().out
    shown = [int(m) for m in re.findall(r"^│\s+(\d+) │ actor_update", folded, flags=re.M)]
    # The first, the three slowest (12 among them; the first may be one), the last two.
    assert {1, 12, 19, 20} <= set(shown) and 4 <= len(shown) <= 6 and shown == sorted(shown), shown
    left = sorted(set(range(1, 21)) - set(shown))
    assert f"{len(left)} step(s) left out (" in folded and "--all-steps shows every step" in folded
    assert main(["report", str(run), "--all-steps"]) == 0
    every = capsys.readouterr().out
    assert len(re.findall(r"^│\s+\d+ │ actor_update", every, flags=re.M)) == 20 and "left out" not in every
    assert main(["report", str(run), "--only", "memory"]) == 0
    memory = capsys.readouterr().out
    assert "Memory by stage" in memory and "Stages by step" not in memory and "Overhead" not in memory
    assert main(["report", str(run), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["stage_steps"]) == 20
