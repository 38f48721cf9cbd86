"""Run folders damaged or crafted after the run: every reader opens regular files only, never
blocks on a FIFO nor reads a device without end, and skips a line nested too deep like any
other line that is not a record.  Each run is written by the library's own observers (timing,
watchdog, sentinel, memory); then its files are replaced.  Every reader runs through the CLI's
``main``; a thread opens each FIFO for writing after a deadline, so that a reader that blocked
on one would come back (with an end of file) and fail the test by its time instead of hanging
the suite."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import verl_events
from verl_events.apps.cli import main

#: report's engines: DuckDB's where it is installed (the core suite runs without it).
ENGINES = ("records", "duckdb") if importlib.util.find_spec("duckdb") is not None else ("records",)
#: Each reader of a run folder, as a user runs it.
READERS = (
    ("diagnose",),
    ("hangs",),
    *(("report", "--engine", engine) for engine in ENGINES),
    ("triage",),
    ("weights",),
    ("mismatch",),
)
#: The files a run of these observers leaves that the readers read, and two logs of other
#: observers a crafted folder may hold.
FILES = (
    "timing/rank0.jsonl",
    "heartbeats/rank0.json",
    "crashes/ends.jsonl",
    "anomalies.jsonl",
    "memory/rank0.jsonl",
    "run.json",
    "weight_sync.jsonl",
    "mismatch.jsonl",
)
#: Far beyond what any reader needs on this run; a reader blocked on a FIFO is released then.
DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of two steps, a NaN at step 2's actor_update."""
    run = tmp_path_factory.mktemp("written") / "run"
    observers = [{"name": "timing"}, {"name": "watchdog"}, {"name": "sentinel"}, {"name": "memory"}]
    with verl_events.install({"save_path": str(run), "observers": observers}):
        for step in (1, 2):
            with verl_events.stage("actor_compute_log_prob", step=step):
                pass
            update = verl_events.stage("actor_update", step=step)
            with update:
                update.set_result({"actor/pg_loss": math.nan if step == 2 else 0.3})
    assert all((run / name).is_file() for name in FILES[:6])
    return run


def copy_of(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    return copy


@contextmanager
def released_after(fifos: list[Path], seconds: float) -> Iterator[None]:
    """After ``seconds``, and then every tenth of a second, open each FIFO for writing and
    close it: a reader blocked in its open or read gets an end of file."""
    done = threading.Event()

    def release() -> None:
        if done.wait(seconds):
            return
        while not done.wait(0.1):
            for fifo in fifos:
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass  # no reader has it open

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def run_readers(run: Path, capsys: pytest.CaptureFixture[str], fifos: list[Path] = ()) -> dict[str, str]:
    """Each reader's stderr, by command; each ends in time, with exit 0, 1 or 2 and no traceback."""
    said = {}
    for reader in READERS:
        with released_after(list(fifos), DEADLINE_S):
            began = time.monotonic()
            code = main([reader[0], str(run), *reader[1:]])
            took = time.monotonic() - began
        out, err = capsys.readouterr()
        assert took < DEADLINE_S, f"{reader} blocked for {took:.0f} s"
        assert code in (0, 1, 2), (reader, code)
        assert "Traceback" not in out + err, (reader, err)
        said[" ".join(reader)] = err
    return said


def test_a_fifo_where_a_file_belongs_is_one_warning_naming_it_and_no_reader_blocks(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_of(written, tmp_path)
    fifos = []
    for name in FILES:
        (run / name).unlink(missing_ok=True)
        os.mkfifo(run / name)
        fifos.append(run / name)
    said = run_readers(run, capsys, fifos)
    # diagnose names each FIFO it reads as what it is (the memory logs it reads only for a death).
    read_by_diagnose = ("timing/rank0.jsonl", "heartbeats/rank0.json", "crashes/ends.jsonl", "anomalies.jsonl")
    for name in (*read_by_diagnose, "weight_sync.jsonl"):
        assert f"{run / name} " in said["diagnose"], said["diagnose"]
    assert said["diagnose"].count("it is a FIFO, not a regular file") == 5
    for engine in ENGINES:
        assert f"{run / 'timing/rank0.jsonl'} cannot be read: it is a FIFO" in said[f"report --engine {engine}"]
    assert f"{run / 'anomalies.jsonl'} cannot be read: it is a FIFO" in said["triage"]
    assert f"{run / 'weight_sync.jsonl'} cannot be read: it is a FIFO" in said["weights"]
    assert f"{run / 'mismatch.jsonl'} cannot be read: it is a FIFO" in said["mismatch"]


def test_a_link_to_a_device_is_refused_without_reading_it(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_of(written, tmp_path)
    for name in ("timing/rank0.jsonl", "anomalies.jsonl", "memory/rank0.jsonl", "heartbeats/rank0.json"):
        (run / name).unlink()
        (run / name).symlink_to("/dev/zero")
    said = run_readers(run, capsys)
    assert f"{run / 'timing/rank0.jsonl'} cannot be read: it is a character device" in said["diagnose"]
    assert f"{run / 'anomalies.jsonl'} cannot be read: it is a character device" in said["triage"]
    assert f"(the first: {run / 'heartbeats/rank0.json'} was skipped: it is a character device" in said["hangs"]


def test_a_line_nested_too_deep_is_skipped_like_any_line_that_is_not_a_record(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_of(written, tmp_path)
    deep = "[" * 100_000 + "]" * 100_000
    line = {}  # the number of the deep line in each log
    for name in ("anomalies.jsonl", "memory/rank0.jsonl", "crashes/ends.jsonl"):
        line[name] = len((run / name).read_text().splitlines()) + 1
        with (run / name).open("a") as log:
            log.write(deep + "\n")
    (run / "heartbeats/rank0.json").write_text(deep)
    said = run_readers(run, capsys)
    too_deep = "(its JSON is nested too deep to read); skipped"
    assert f"anomalies.jsonl:{line['anomalies.jsonl']}: not an anomaly record {too_deep}" in said["triage"]
    assert "rank0.json was skipped: it is not JSON (its JSON is nested too deep to read)" in said["diagnose"]
    assert (
        f"{run / 'crashes/ends.jsonl'}:{line['crashes/ends.jsonl']}: not a process's end {too_deep}" in said["diagnose"]
    )
    memory = f"{run / 'memory/rank0.jsonl'}:{line['memory/rank0.jsonl']}: not a memory record {too_deep}"
    assert all(memory in said[f"report --engine {engine}"] for engine in ENGINES)


def test_values_of_the_wrong_type_or_out_of_range_are_skipped_naming_the_field(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step as text, a NaN time, a pid no process has, a step past 64 bits, a negative
    duration, a word the field does not hold, a time days ahead of this clock: each line is
    skipped with a warning naming its file, line and field."""
    run = copy_of(written, tmp_path)
    anomaly = json.loads((run / "anomalies.jsonl").read_text().splitlines()[0])
    end = json.loads((run / "crashes/ends.jsonl").read_text().splitlines()[0])
    memory = json.loads((run / "memory/rank0.jsonl").read_text().splitlines()[0])
    crafted = {
        "anomalies.jsonl": [anomaly | {"step": "3"}, anomaly | {"rank": 2**70}],
        "crashes/ends.jsonl": [
            end | {"pid": 0},
            end | {"time": math.nan},
            end | {"how": "exploded"},
            end | {"time": time.time() + 3 * 86_400},
        ],
        "memory/rank0.jsonl": [memory | {"host_peak_bytes": -1}, memory | {"rank": "0"}],
    }
    line = {}
    for name, records in crafted.items():
        line[name] = len((run / name).read_text().splitlines()) + 1
        with (run / name).open("a") as log:
            log.writelines(json.dumps(record) + "\n" for record in records)  # NaN as Python's json writes it
    beat = json.loads((run / "heartbeats/rank0.json").read_text())
    (run / "heartbeats/rank0.json").write_text(json.dumps(beat | {"pid": 2**70}))
    said = run_readers(run, capsys)
    at = {name: f"{run / name}:{line[name]}" for name in crafted}
    assert f"{at['anomalies.jsonl']}: not an anomaly record (its step is '3', not" in said["triage"]
    second = f"{run / 'anomalies.jsonl'}:{line['anomalies.jsonl'] + 1}"
    assert f"{second}: not an anomaly record (its rank is {2**70}, not an integer)" in said["triage"]
    assert f"{at['crashes/ends.jsonl']}: not a process's end (its pid is 0, which no process has)" in said["diagnose"]
    nan_time = f"{run / 'crashes/ends.jsonl'}:{line['crashes/ends.jsonl'] + 1}: not a process's end (its time is nan"
    assert nan_time in said["diagnose"]
    third = f"{run / 'crashes/ends.jsonl'}:{line['crashes/ends.jsonl'] + 2}"
    assert f"{third}: not a process's end (its how is 'exploded', not normal or" in said["diagnose"]
    fourth = f"{run / 'crashes/ends.jsonl'}:{line['crashes/ends.jsonl'] + 3}"
    assert f"{fourth}: not a process's end (its time is " in said["diagnose"]
    assert "more than a day after this machine's clock)" in said["diagnose"]
    negative = f"{at['memory/rank0.jsonl']}: not a memory record (its host_peak_bytes is -1, below 0)"
    assert all(negative in said[f"report --engine {engine}"] for engine in ENGINES)
    assert f"rank0.json was skipped: its pid is {2**70}, not an integer" in said["diagnose"]


@pytest.mark.parametrize("pid", [1, 2**40], ids=["pid-1", "pid-past-the-kernels"])
def test_a_heartbeat_whose_pid_cannot_be_its_ranks_process_is_never_running(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], pid: int
) -> None:
    """A heartbeat left open an hour ago, naming pid 1 (always some process on a host) or a
    pid no kernel hands out, with no start time to tell its process: the rank is not alive."""
    run = copy_of(written, tmp_path)
    beat = json.loads((run / "heartbeats/rank0.json").read_text())
    hour_ago = time.time() - 3600
    beat |= {"pid": pid, "started": None, "closed": False, "exit": None, "time": hour_ago, "mtime_beats": False}
    beat["liveness_s"] = None  # as an older writer's: no liveness beat to judge its age by
    (run / "heartbeats/rank0.json").write_text(json.dumps(beat))
    (run / "heartbeats/rank0.boundary").unlink()
    (run / "crashes/ends.jsonl").unlink()  # no word of how it ended
    main(["diagnose", str(run), "--json"])
    result = json.loads(capsys.readouterr().out)
    (watchdog,) = [tool["summary"] for tool in result["tools"] if tool["tool"] == "watchdog"]
    assert result["verdict"] != "running" and "alive" not in watchdog, result
    run_readers(run, capsys)  # and no reader gives a traceback


def test_a_record_of_another_run_is_skipped_by_every_reader_in_one_sentence(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command reads through one evidence object: a record whose run is not the folder's
    (run.json) is skipped, named by file and line, whichever command reads it."""
    run = copy_of(written, tmp_path)
    this_run = json.loads((run / "run.json").read_text())["run_id"]

    def of_another_run(text: str) -> str:
        record = json.loads(text)
        assert record["run"] == this_run
        return json.dumps({**record, "run": "another-run"})

    anomalies = run / "anomalies.jsonl"
    first = anomalies.read_text().splitlines()[0]
    anomalies.write_text(of_another_run(first) + "\n" + anomalies.read_text())
    beat = run / "heartbeats" / "rank0.json"
    (beat.parent / "rank1.json").write_text(of_another_run(beat.read_text()))
    said = run_readers(run, capsys)
    skipped = f"was skipped: it belongs to run 'another-run', and this folder to run {this_run!r}"
    for reader in ("diagnose", "triage"):
        assert f"{anomalies}:1 {skipped}" in said[reader], said[reader]
    for reader in ("diagnose", "hangs"):
        assert f"{beat.parent / 'rank1.json'} {skipped}" in said[reader], said[reader]
    # The anomaly of this run is still the one triage and diagnose name.
    assert main(["triage", str(run), "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["anomaly"]["step"] == 2


def test_a_folder_where_a_log_belongs_is_one_warning_for_every_reader_and_both_engines(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy_of(written, tmp_path)
    for name in ("timing/rank0.jsonl", "anomalies.jsonl", "memory/rank0.jsonl"):
        (run / name).unlink()
        (run / name).mkdir()
    said = run_readers(run, capsys)
    for engine in ENGINES:
        assert f"{run / 'timing/rank0.jsonl'} cannot be read: it is a directory" in said[f"report --engine {engine}"]
    assert f"{run / 'anomalies.jsonl'} cannot be read: it is a directory" in said["triage"]
