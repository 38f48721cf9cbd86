"""``verl-events report --engine``: DuckDB's columnar report (verl_events/apps/report/columnar/)
says what the record-by-record report says, on the same runs: a synthetic run in every
format with its planted failure (benchmarks/scale.py), the demo's real runs (msprobe
sessions, two ranks), a run of stragglers, hiccups, waiting ranks, stages that raised,
nested and profiled stages and a leak, and logs a crash or another writer left behind.
The real two-rank straggler runs are compared in tests/test_stragglers.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from verl_events.apps.cli import main
from verl_events.apps.read.overhead import observer_hooks as record_observer_hooks
from verl_events.apps.read.overhead import read_timing_records
from verl_events.apps.report.columnar.figures import observer_hooks
from verl_events.apps.report.columnar.load import connect, load_timing, timing_sources
from verl_events.apps.report.raised import split_raised
from verl_events.apps.report.steps import STAGE_ORDER
from verl_events.observers.memory import record as memory_record
from verl_events.observers.timing import TimingRecord, timing_log_files, timing_log_path

from .report_support import assert_engines_agree, differences, engine_output
from .support import REPO

pytest.importorskip("duckdb")

OBSERVERS = ("timing", "watchdog", "msprobe")


def timed(stage: str, step: int | None, rank: int, seconds: float, end: float, **fields: object) -> TimingRecord:
    """A stage record as the timing observer writes it, with every observer's hook times."""
    hooks = {name: 1e-5 * (i + 1) * (rank + 1) for i, name in enumerate(OBSERVERS)}
    return TimingRecord(
        run="mixed",
        stage=stage,
        step=step,
        rank=rank,
        world_size=4,
        elapsed_s=seconds,
        observers=OBSERVERS,
        profiled=bool(fields.get("profiled_by") or fields.get("enclosed_by")),
        hook_s=hooks,
        hook_begin_s={name: s / 2 for name, s in hooks.items()},
        hook_end_s={name: s / 2 for name, s in hooks.items()},
        overhead_s=sum(s for name, s in hooks.items() if name != "timing"),
        end_unix=end,
        **fields,  # type: ignore[arg-type]
    )


def mixed_run(run: Path) -> None:
    """Four ranks, eight steps, each stage begun by every rank together (the collectives of
    the stage before line them up): rank 3 a straggler in actor_update, rank 2 a hiccup at
    step 5 of compute_values, rank 0 in critic_update beginning 0.3 s early and ending with
    the others (it waited); at step 8 rank 1 raises in critic_update and the others fail
    waiting for it; msprobe profiles actor_compute_log_prob at steps 2 and 3, and train_batch
    inside actor_update at step 4 (around); a stage without a step; rank 2's memory grows
    50 MB a step in actor_update."""
    logs: dict[int, list[TimingRecord]] = {rank: [] for rank in range(4)}
    memory: dict[int, list[str]] = {rank: [] for rank in range(4)}
    clock = 1_700_000_000.0

    def stage_of_all(stage: str, step: int | None, seconds: dict[int, float], **fields: object) -> None:
        nonlocal clock
        ends = {}
        for rank, elapsed in seconds.items():
            early = 0.3 if (stage, rank) == ("critic_update", 0) else 0.0  # began early: ends with the others
            ends[rank] = clock + elapsed - early
            error = {}
            if stage == "critic_update" and step == 8:
                error = {"error": "RuntimeError" if rank == 1 else "DistBackendError", "message": "gone"}
            logs[rank].append(timed(stage, step, rank, elapsed, ends[rank], **fields, **error))
            if stage == "train_batch" or error:
                continue
            leaking = rank == 2 and stage == "actor_update"
            held = 2**30 + (50 * 2**20 * (step or 0) if leaking else 0)
            kept = 50 * 2**20 if leaking else 2**20 * (rank % 2)
            memory[rank].append(
                memory_record.MemoryRecord(
                    run="mixed", step=step, stage=stage, rank=rank, role=None, time=ends[rank], pid=100 + rank,
                    error=None, host_begin_bytes=held, host_peak_bytes=held + kept + 2**24 * rank,
                    host_end_bytes=held + kept, host_peak="reset", device_peak_bytes=None, device=None, cgroup=None,
                ).to_json()
            )  # fmt: skip
        clock = max(ends.values()) + 0.01

    for step in range(1, 9):
        profiled = {"profiled_by": ("msprobe",), "dump_bytes": 1000 * step} if step in (2, 3) else {}
        stage_of_all("actor_compute_log_prob", step, {r: 0.2 + 0.01 * r for r in range(4)}, **profiled)
        stage_of_all("compute_values", step, {r: 0.5 if (r, step) == (2, 5) else 0.1 + 0.001 * r for r in range(4)})
        critic = {r: (0.4 if r == 0 else 0.1) for r in range(4)}
        if step == 8:
            critic = {0: 9.0, 1: 0.05, 2: 9.0, 3: 9.0}
        stage_of_all("critic_update", step, critic)
        inner = {"enclosed_by": ("msprobe",)} if step == 4 else {}
        stage_of_all("train_batch", step, {r: 0.1 for r in range(4)}, depth=1, parent="actor_update", **inner)
        stage_of_all("actor_update", step, {r: 0.3 * (3 if r == 3 else 1) + 0.002 * r for r in range(4)})
    stage_of_all("save_checkpoint", None, {r: 0.05 for r in range(4)})
    for rank, records in logs.items():
        path = timing_log_path(run, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(record.to_json() + "\n" for record in records))
        memory_path = memory_record.memory_log_path(run, rank)
        memory_path.parent.mkdir(parents=True, exist_ok=True)
        memory_path.write_text("\n".join(memory[rank]) + "\n")


def test_the_engines_agree_on_stragglers_hiccups_waits_failures_profiles_and_a_leak(tmp_path: Path) -> None:
    mixed_run(tmp_path)
    result = assert_engines_agree(tmp_path)
    rows = {row["stage"]: row for row in result["stragglers"]}
    assert rows["actor_update"]["straggler_ranks"] == [3]
    assert rows["compute_values"]["hiccup_ranks"] == [2]
    assert rows["critic_update"]["waited_ranks"] == [0]
    (raised,) = result["raised"]
    assert (raised["stage"], raised["n"], raised["ranks"]) == ("critic_update", 4, [0, 1, 2, 3])
    profiled = [row for row in result["overhead"] if row["profiled_by"]]
    assert {tuple(row["profiled_by"]) for row in profiled} == {("msprobe",), ("msprobe (around)",)}
    for engine in ("records", "duckdb"):  # the table says what "(around)" means
        assert (
            "NAME (around): the stage ran inside another stage that NAME profiled" in engine_output(tmp_path, engine)[1]
        )
    leaks = [row["stage"] for row in result["memory"] if row["leak"]]
    assert leaks == ["actor_update"]
    assert None in [row["step"] for row in result["stage_steps"]]  # save_checkpoint, without a step


def test_hook_medians_taken_by_sorting_are_those_held_in_memory(tmp_path: Path) -> None:
    """observer_hooks takes its medians by sorting (spilling to disk) past a third of DuckDB's
    memory: both ways give the record-by-record report's figures."""
    mixed_run(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    sources = timing_sources(timing_log_files(tmp_path), scratch)
    con = connect(scratch, sources.targets)
    load_timing(con, sources, [])
    held = [asdict(row) for row in observer_hooks(con, memory_bytes=10**12)]
    by_sorting = [asdict(row) for row in observer_hooks(con, memory_bytes=0)]
    con.close()
    figures, _ = split_raised(read_timing_records(tmp_path))
    expected = [asdict(row) for row in record_observer_hooks(figures, STAGE_ORDER)]
    assert len(expected) == len(OBSERVERS) * 6  # the six stages, save_checkpoint among them
    assert differences(expected, held) == [] and differences(expected, by_sorting) == []


def test_the_engines_agree_on_a_synthetic_run_in_every_format(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks/scale.py"), "--ranks", "16", "--steps", "30", "--keep",
         str(tmp_path), "--commands", "triage"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    result = assert_engines_agree(tmp_path / "r16_s30")
    (raised,) = result["raised"]
    assert (raised["stage"], raised["steps"], raised["ranks"]) == ("compute_values", [30], [12])
    # Step 30 ends in compute_values (the fourth stage): rank 12 raised, the others hang after it.
    assert result["records"] == 16 * 29 * 8 + 16 * 4 and len(result["memory"]) == 8


def test_duckdb_past_its_memory_says_so_and_how_to_give_it_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mixed_run(tmp_path)
    assert main(["report", str(tmp_path), "--engine", "duckdb", "--duckdb-memory", "1MB"]) == 2
    said = capsys.readouterr().err
    assert (
        "DuckDB needed more than --duckdb-memory 1MB" in said and "give it more, e.g. --duckdb-memory 0.002GB" in said
    )
    assert main(["report", str(tmp_path), "--duckdb-memory", "lots"]) == 2
    assert "--duckdb-memory 'lots' is not a size" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--json", "--engine", "duckdb", "--duckdb-memory", "256MB"]) == 0


def test_the_engines_agree_on_the_demo_runs(demo_runs: dict[str, Path]) -> None:
    for name in ("a", "two_ranks"):
        result = assert_engines_agree(demo_runs[name])
        assert any(row["profiled_by"] for row in result["overhead"])  # msprobe sessions


def one_log(run: Path, *lines: str) -> None:
    path = timing_log_path(run, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))


def line(step: int, run: str = "r1") -> str:
    return timed("actor_update", step, 0, 0.1 * step, 1_700_000_000.0 + step).to_json().replace('"mixed"', f'"{run}"')


def test_a_log_cut_short_is_read_with_the_same_warning_by_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_log(tmp_path, *(line(step) + "\n" for step in range(1, 6)), line(6)[:40])
    warnings = {}
    for engine in ("records", "duckdb"):
        assert main(["report", str(tmp_path), "--json", "--engine", engine]) == 0
        out, warnings[engine] = capsys.readouterr()
        assert json.loads(out)["records"] == 5
    assert warnings["duckdb"] == warnings["records"] and "the last line is cut short" in warnings["records"]
    assert_engines_agree(tmp_path)


def warnings_and_json(capsys: pytest.CaptureFixture[str], run: Path, engine: str) -> tuple[str, dict[str, Any]]:
    assert main(["report", str(run), "--json", "--engine", engine]) == 0
    out, err = capsys.readouterr()
    return err, json.loads(out)


def said_by_both(capsys: pytest.CaptureFixture[str], run: Path, code: int) -> tuple[str, str]:
    """What ``report RUN`` writes on stderr with each engine, both exiting ``code``."""
    said = []
    for engine in ("records", "duckdb"):
        assert main(["report", str(run), "--engine", engine]) == code
        said.append(capsys.readouterr().err)
    return said[0], said[1]


def test_another_writers_lines_are_skipped_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log DuckDB would misread is read by its owner, and its good lines handed to DuckDB."""
    one_log(tmp_path, line(1) + "\n", '{"event": "note", "text": "not a stage"}\n', line(2) + "\n")
    said, result = warnings_and_json(capsys, tmp_path, "duckdb")
    assert said == warnings_and_json(capsys, tmp_path, "records")[0]
    assert "1 line(s) are not stage records of the timing observer and were skipped" in said
    assert result["records"] == 2 and "record by record" not in said
    assert_engines_agree(tmp_path)


def test_a_damaged_line_inside_a_log_is_the_same_error_by_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_log(tmp_path, line(1) + "\n", "{not json\n", line(2) + "\n")
    records, duckdb = said_by_both(capsys, tmp_path, 2)
    assert records == duckdb and "rank0.jsonl:2 is not a JSON line" in records


def test_lines_of_an_older_writer_are_read_record_by_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without observers and end_unix (logs of an older writer) DuckDB's engine steps aside."""
    old = [
        json.dumps({"stage": "actor_update", "step": s, "rank": 0, "elapsed_s": 0.1, "profiled": False}) for s in (1, 2)
    ]
    one_log(tmp_path, *(text + "\n" for text in old))
    said, result = warnings_and_json(capsys, tmp_path, "duckdb")
    assert "read record by record: 2 line(s) of the timing logs are of a writer without observers" in said
    assert result["records"] == 2


def test_missing_optional_fields_take_their_defaults_alike(tmp_path: Path) -> None:
    lines = []
    for step in (1, 2, 3):
        data = json.loads(line(step))
        for optional in ("depth", "overhead_s", "dump_bytes", "profiled_by", "enclosed_by", "hook_end_s"):
            data.pop(optional)
        lines.append(json.dumps(data) + "\n")
    one_log(tmp_path, *lines)
    assert assert_engines_agree(tmp_path)["records"] == 3


def test_a_memory_log_with_a_bad_line_and_a_rank_without_a_device_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mixed_run(tmp_path)
    first = memory_record.memory_log_path(tmp_path, 0)
    lines = first.read_text().splitlines()
    with_device = json.loads(lines[0])
    with_device["device_peak_bytes"] = 5 * 2**30  # rank 0 has a device figure at step 1, the other ranks none
    first.write_text("\n".join([json.dumps(with_device), *lines[1:]]) + "\n")
    damaged = memory_record.memory_log_path(tmp_path, 1)
    lines = damaged.read_text().splitlines()
    damaged.write_text("\n".join([lines[0], "{not json", '{"no": "record"}', *lines[1:]]) + "\n")
    said, result = warnings_and_json(capsys, tmp_path, "duckdb")
    assert said == warnings_and_json(capsys, tmp_path, "records")[0]
    assert "rank1.jsonl:2: not a JSON line (" in said and "rank1.jsonl:3: not a memory record (it lacks" in said
    assert_engines_agree(tmp_path)
    assert result["memory"][0]["device_peak_max_mb"] == 5 * 1024  # the ranks without a figure left out


def test_a_log_of_two_runs_warns_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_log(tmp_path, line(1, "r1") + "\n", line(2, "r2") + "\n")
    records, duckdb = said_by_both(capsys, tmp_path, 0)
    assert records == duckdb and "records of 2 runs (r1, r2)" in records


def test_trace_needs_the_records_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_log(tmp_path, line(1) + "\n")
    assert main(["report", str(tmp_path), "--engine", "duckdb", "--trace", str(tmp_path / "t.json")]) == 2
    assert "--trace draws every record" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--trace", str(tmp_path / "t.json"), "--quiet"]) == 0  # auto: records
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_an_empty_log_is_the_same_error_by_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_log(tmp_path, "\n")
    records, duckdb = said_by_both(capsys, tmp_path, 2)
    assert records == duckdb and "holds no stage records" in records


def test_engine_output_is_the_json_and_the_tables(tmp_path: Path) -> None:
    one_log(tmp_path, *(line(step) + "\n" for step in range(1, 4)))
    result, text = engine_output(tmp_path, "duckdb")
    assert result["records"] == 3 and "Stages by step" in text


@pytest.mark.parametrize(
    "damage",
    [
        {"elapsed_s": "fast"},
        {"elapsed_s": -1.0},
        {"step": "3"},
        {"stage": {"name": "actor_update"}},
        {"rank": 2**70},
        {"hook_s": [1, 2]},
        {"dump_bytes": -5},
        {"end_unix": time.time() + 3 * 86_400},
    ],
    ids=[
        "elapsed-text",
        "elapsed-negative",
        "step-text",
        "stage-object",
        "rank-past-64-bits",
        "hook_s-list",
        "bytes-negative",
        "end-days-in-the-future",
    ],
)
def test_a_line_whose_values_are_of_the_wrong_type_or_range_is_skipped_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: dict[str, Any]
) -> None:
    """Another writer's (or a hand's) values are checked before any figure uses them: the
    line is skipped, with the same sentence from both engines, and the others are reported."""
    bad = json.dumps(json.loads(line(2)) | damage)
    one_log(tmp_path, line(1) + "\n", bad + "\n", line(3) + "\n")
    said, result = warnings_and_json(capsys, tmp_path, "duckdb")
    assert said == warnings_and_json(capsys, tmp_path, "records")[0]
    assert "1 line(s) are not stage records of the timing observer and were skipped" in said
    assert result["records"] == 2
    assert_engines_agree(tmp_path)


def test_a_memory_record_dated_days_ahead_of_this_clock_is_one_skipped_line_for_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mixed_run(tmp_path)
    log = memory_record.memory_log_path(tmp_path, 1)
    lines = log.read_text().splitlines()
    ahead = json.loads(lines[-1]) | {"time": time.time() + 3 * 86_400}
    with log.open("a") as out:
        out.write(json.dumps(ahead) + "\n")
    said, result = warnings_and_json(capsys, tmp_path, "duckdb")
    assert said == warnings_and_json(capsys, tmp_path, "records")[0]
    assert f"rank1.jsonl:{len(lines) + 1}: not a memory record (its time is " in said, said
    assert "more than a day after this machine's clock" in said
    assert_engines_agree(tmp_path)


def test_a_memory_log_line_of_bytes_that_are_not_utf8_is_one_skipped_line_for_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mixed_run(tmp_path)
    log = memory_record.memory_log_path(tmp_path, 1)
    lines = len(log.read_text().splitlines())
    with log.open("ab") as out:
        out.write(b'\xff\xfe{"stage": "x"}\n')
    said, result = warnings_and_json(capsys, tmp_path, "duckdb")
    assert said == warnings_and_json(capsys, tmp_path, "records")[0]
    assert f"rank1.jsonl:{lines + 1}: not a JSON line (" in said and "Traceback" not in said
    assert_engines_agree(tmp_path)
