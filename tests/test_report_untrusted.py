"""``verl-events report`` on run folders someone else wrote: nothing read from a log becomes
DuckDB's SQL, no folder or file name is read as a pattern, and DuckDB's connection reads
only the logs it was handed (verl_events/apps/report/columnar/load.py, sources.py).  Every
run here is written by the timing observer's own record class; only the names are hostile.
Each case is read by both engines, whose JSON and tables must be the same."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from verl_events.apps.cli import main
from verl_events.apps.report import columnar, summary
from verl_events.apps.report.columnar.load import connect, timing_sources
from verl_events.observers.timing import TimingRecord, timing_log_path

from .report_support import assert_engines_agree, differences, engine_output

duckdb = pytest.importorskip("duckdb")

#: Observer names as a hostile line may spell them: SQL in every quoting DuckDB has, a file
#: read by a table function, names DuckDB's identifiers would fold together, and none.
HOSTILE_NAMES = (
    "q'||(SELECT content FROM read_text('{marker}'))||'",
    "q\" DOUBLE)'}}) j, read_text('{marker}') t --",
    "'); COPY (SELECT 1) TO '{marker}.copy'; --",
    'a"b',
    "back\\slash",
    "",
    "Timing",
    "timing",
    "ünïcode ✓",
)


def records(names: tuple[str, ...], steps: int, rank: int = 0, run: str = "r1") -> list[str]:
    lines = []
    for step in range(1, steps + 1):
        hooks = {name: 1e-5 * (i + 1) * step for i, name in enumerate(names)}
        lines.append(
            TimingRecord(
                run=run, stage="actor_update" if step % 2 else "critic_update", step=step, rank=rank, world_size=2,
                elapsed_s=0.1 + 0.001 * step, observers=names, profiled=False, hook_s=hooks,
                hook_begin_s={name: s / 2 for name, s in hooks.items()},
                hook_end_s={name: s / 2 for name, s in hooks.items()},
                overhead_s=sum(hooks.values()) - hooks.get("timing", 0.0), end_unix=1_700_000_000.0 + step,
            ).to_json()
        )  # fmt: skip
    return lines


def write_log(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


def marker_file(tmp_path: Path) -> tuple[Path, str]:
    """A file outside the run whose content must never reach an output."""
    marker = tmp_path / "outside" / "secret.txt"
    marker.parent.mkdir()
    marker.write_text("SECRET-OUTSIDE-THE-RUN\n")
    return marker, "SECRET-OUTSIDE-THE-RUN"


def hostile(marker: Path) -> tuple[str, ...]:
    return tuple(name.format(marker=marker) for name in HOSTILE_NAMES)


def said(capsys: pytest.CaptureFixture[str], run: Path | str, engine: str) -> tuple[int, str, str]:
    code = main(["report", str(run), "--json", "--engine", engine])
    out, err = capsys.readouterr()
    return code, out, err


def test_observer_names_written_as_sql_are_read_as_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker, secret = marker_file(tmp_path)
    names = hostile(marker)
    run = tmp_path / "run"
    write_log(timing_log_path(run, 0), records(names, 6))
    write_log(timing_log_path(run, 1), records(names, 6, rank=1))
    result = assert_engines_agree(run)
    assert {row["observer"] for row in result["observer_hooks"]} == set(names)  # "" and both cases among them
    outputs = [engine_output(run, engine)[1] for engine in ("records", "duckdb")]
    for engine in ("records", "duckdb"):
        code, out, err = said(capsys, run, engine)
        assert code == 0 and err == "", err  # no engine stepped aside, nothing skipped
        outputs += [out, err]
    assert not any(secret in text for text in outputs)
    assert not Path(f"{marker}.copy").exists()


def test_past_64_mib_auto_takes_duckdb_and_hostile_names_stay_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    marker, secret = marker_file(tmp_path)
    run = tmp_path / "run"
    line = records(hostile(marker), 1)[0]
    steps = summary.COLUMNAR_FROM_BYTES // len(line) + 1
    write_log(timing_log_path(run, 0), records(hostile(marker), steps))
    taken = []
    real = columnar.columnar_parts

    def duckdb_engine(*args: Any, **kwargs: Any) -> Any:
        taken.append("duckdb")
        return real(*args, **kwargs)

    monkeypatch.setattr(columnar, "columnar_parts", duckdb_engine)
    code, auto, err = said(capsys, run, "auto")
    assert code == 0 and err == "" and taken == ["duckdb"]
    assert secret not in auto
    code, by_records, _ = said(capsys, run, "records")
    assert code == 0 and differences(json.loads(by_records), json.loads(auto)) == []
    assert json.loads(auto)["records"] == steps


#: Folder names with every character a path pattern, a shell or SQL could make special.
FOLDER_NAMES = ("r[0]", "r'q", 'r"q', "r\\q", "r*", "r?", "{a,b}", "r with spaces", "line\nbreak", "ünï✓", "~")


def test_no_character_of_a_folder_name_is_a_pattern(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each run lies beside a decoy that a pattern would match (``r0`` for ``r[0]``, ``rq``
    for ``r?`` and ``r*``, ``a`` for ``{a,b}``) holding more records of another run."""
    for decoy in ("r0", "rq", "a", "b"):
        write_log(timing_log_path(tmp_path / decoy, 0), records(("timing",), 9, run="decoy"))
    for name in FOLDER_NAMES:
        run = tmp_path / name
        write_log(timing_log_path(run, 0), records(("timing", "msprobe"), 4))
        result = assert_engines_agree(run)
        assert (result["records"], result["headline"]["run"]) == (4, "r1"), name


def test_a_run_folder_named_tilde_is_not_the_home_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    write_log(timing_log_path(home, 0), records(("timing",), 9, run="home"))
    write_log(timing_log_path(tmp_path / "~", 0), records(("timing",), 4))
    monkeypatch.chdir(tmp_path)
    outputs = {engine: said(capsys, "~", engine) for engine in ("records", "duckdb")}
    for code, _, err in outputs.values():
        assert (code, err) == (0, "")
    by_records, by_duckdb = (json.loads(out) for _, out, _ in outputs.values())
    assert differences(by_records, by_duckdb) == []
    assert (by_duckdb["records"], by_duckdb["headline"]["run"]) == (4, "r1")


def test_a_log_named_like_a_pattern_is_read_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``rank*.jsonl`` is a log of its own: DuckDB must not read it as every rank's log."""
    write_log(timing_log_path(tmp_path, 0), records(("timing",), 5))
    write_log(timing_log_path(tmp_path, 1), records(("timing",), 5, rank=1))
    write_log(timing_log_path(tmp_path, 0).with_name("rank*.jsonl"), records(("timing",), 3, rank=2))
    write_log(timing_log_path(tmp_path, 0).with_name("rank[1].jsonl"), records(("timing",), 2, rank=3))
    result = assert_engines_agree(tmp_path)
    assert result["records"] == 5 + 5 + 3 + 2


def test_a_key_twice_in_one_object_is_read_record_by_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JSON lets an object name a key twice (the last wins, as Python reads it); DuckDB's map
    cannot say which, so its engine steps aside, and the report is the same."""
    lines = records(("timing", "msprobe"), 4)
    lines[1] = lines[1].replace('"hook_s":{"timing"', '"hook_s":{"msprobe":9.0,"timing"', 1)
    write_log(timing_log_path(tmp_path, 0), lines)
    code, out, err = said(capsys, tmp_path, "duckdb")
    # DuckDB 2 refuses such a map (the message names the log), 1.4 keeps both keys (the engine counts them).
    assert code == 0 and (
        f"DuckDB cannot read the timing logs (Invalid Input Error: JSON transform error in file "
        f'"{timing_log_path(tmp_path, 0)}"'
        in err
        or "1 line(s) of the timing logs name an observer twice" in err
    ), err
    assert out == said(capsys, tmp_path, "records")[1]


def test_a_scratch_folder_duckdb_would_read_as_a_pattern_leaves_the_run_to_the_records_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_log(timing_log_path(tmp_path / "run", 0), records(("timing",), 4))
    scratch = tmp_path / "tmp[1]"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    code, out, err = said(capsys, tmp_path / "run", "duckdb")
    assert code == 0 and "would read its scratch folder" in err and "set TMPDIR" in err
    assert json.loads(out)["records"] == 4


def connection(tmp_path: Path) -> tuple[Any, Path]:
    write_log(timing_log_path(tmp_path / "run", 0), records(("timing",), 2))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    sources = timing_sources([timing_log_path(tmp_path / "run", 0)], scratch)
    return connect(scratch, sources.targets), Path(sources.names[0])


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM read_text('{marker}')",
        "SELECT * FROM read_text('{run}/timing/rank*.jsonl')",  # the log itself, by a pattern
        "COPY (SELECT 1) TO '{marker}.copy'",
        "SET enable_external_access = true",
        "SET allowed_paths = ['{marker}']",
        "SET lock_configuration = false",
        "INSTALL httpfs",
        "LOAD httpfs",
        "ATTACH '{marker}.db'",
    ],
)
def test_the_connection_reads_only_the_logs_it_was_handed(tmp_path: Path, query: str) -> None:
    marker, _ = marker_file(tmp_path)
    con, link = connection(tmp_path)
    try:
        assert con.execute("SELECT count(*) FROM read_json(?)", [[str(link)]]).fetchone() == (2,)
        with pytest.raises(duckdb.Error, match="disabled|locked|Permission"):
            con.execute(query.format(marker=marker, run=tmp_path / "run"))
    finally:
        con.close()
    assert not os.path.exists(f"{marker}.copy") and not os.path.exists(f"{marker}.db")


def test_a_log_that_is_not_a_regular_file_is_never_handed_to_duckdb(tmp_path: Path) -> None:
    """A FIFO would never end a read; a link to a device never stop one."""
    good = timing_log_path(tmp_path / "run", 0)
    write_log(good, records(("timing",), 2))
    fifo = good.with_name("rank1.jsonl")
    os.mkfifo(fifo)
    device = good.with_name("rank2.jsonl")
    device.symlink_to("/dev/zero")
    for log in (fifo, device):
        scratch = tmp_path / f"scratch-{log.name}"
        with pytest.raises(columnar.NotColumnar, match=f"{log.name} is not a regular file"):
            timing_sources([good, log], scratch)
