"""A disk that fills up while a dumped stage runs.

Two ways to make every later write fail, both real kernel errors:

* ``tmpfs`` (root only): the run writes into a 4 MiB tmpfs, which the test
  fills to the last byte at the handshake (ENOSPC);
* ``file size limit`` (any user): the test lowers the driver's
  RLIMIT_FSIZE to 100 bytes past the timing log's size at the handshake,
  so no file grows past that (EFBIG; Python ignores SIGXFSZ).  The first
  timing line written after it is cut after exactly 100 bytes.

On the tmpfs a timing line is cut only where it crosses a 4 KiB page (the
file's last page has room for what fits in it), so there the run goes on
for six more steps, undumped once msprobe is switched off, and the log
crosses one.  Under the file size limit it stops at step 2: a later dumped
stage would meet the failure of the last test here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .processes import Child, check_save_path, cli, driver, entries, log_records, marker, session, timing_lines

pytestmark = pytest.mark.slow  # processes, demos or builds: skipped by -m 'not slow'

WAYS = ("tmpfs", "file size limit")
STEPS = {"tmpfs": 8, "file size limit": 2}


def fill_tmpfs(mount: Path) -> Callable[[Child], None]:
    def fill(child: Child) -> None:
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for chunk in (b"\0" * 65536, b"\0"):  # big writes, then the last bytes one by one
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, chunk)
        finally:
            os.close(fd)
        # What the driver writes next fails for want of space, not of permission.
        with pytest.raises(OSError, match="No space left on device"):
            (mount / "probe").write_bytes(b"\0" * 4096)

    return fill


def limit_file_size(save_path: Path) -> Callable[[Child], None]:
    def fill(child: Child) -> None:
        limit = (save_path / "timing" / "rank0.jsonl").stat().st_size + 100
        resource.prlimit(child.proc.pid, resource.RLIMIT_FSIZE, (limit, limit))

    return fill


@contextlib.contextmanager
def disk(way: str, root: Path) -> Iterator[tuple[Path, Callable[[Child], None]]]:
    """Where to put the run's save_path, and how to fill the disk under it."""
    if way == "file size limit":
        yield root / "run", limit_file_size(root / "run")
        return
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the 'file size limit' case covers a write failure")
    mount = root / "disk"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield mount / "run", fill_tmpfs(mount)
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


@dataclass(frozen=True)
class Filled:
    way: str
    save_path: Path
    returncode: int
    stdout: str
    stderr: str


def run_filled_at(way: str, root: Path, pause: str, steps: int) -> Iterator[Filled]:
    with disk(way, root) as (save_path, fill):
        child = driver(save_path, "--steps", str(steps), "--pause", pause)
        child.wait_for("IN STAGE")
        fill(child)
        child.go_on()
        yield Filled(way, save_path, child.finish(), child.stdout, child.stderr)


@pytest.fixture(scope="module", params=WAYS)
def full_at_the_stop(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Filled]:
    """The disk fills in step 2's actor_update after msprobe's periodic
    save: the session's stop, which writes the whole dump.json, fails."""
    way: str = request.param
    yield from run_filled_at(way, tmp_path_factory.mktemp("full"), "2:520", STEPS[way])


def test_training_finishes_when_the_disk_fills_inside_a_dumped_stage(full_at_the_stop: Filled) -> None:
    assert full_at_the_stop.returncode == 0, full_at_the_stop.stderr
    assert full_at_the_stop.stdout.endswith("TRAINING FINISHED\n")


def test_the_failed_stop_is_logged_and_its_session_stays_marked_cut_off(full_at_the_stop: Filled) -> None:
    run = full_at_the_stop
    assert marker(session(run.save_path, 2, "actor_update")) == "cut off during step 2 actor_update (rank 0)"
    failures = [r for r in log_records(run.stderr) if "observer 'msprobe' failed in on_stage_end" in r]
    assert failures and "for stage 'actor_update' (step 2, rank 0)" in failures[0]
    assert re.search(r"No space left on device|File too large", failures[0])


def test_the_timing_observers_failed_write_is_logged(full_at_the_stop: Filled) -> None:
    failures = [r for r in log_records(full_at_the_stop.stderr) if "observer 'timing' failed in on_stage_report" in r]
    assert failures
    assert re.search(r"No space left on device|File too large", failures[0])


def test_sessions_finished_before_the_disk_filled_are_whole(full_at_the_stop: Filled, whole_run: Path) -> None:
    for step, stage in [(1, "actor_compute_log_prob"), (1, "actor_update"), (2, "actor_compute_log_prob")]:
        rank_dir = session(full_at_the_stop.save_path, step, stage)
        assert marker(rank_dir) is None
        assert entries(rank_dir).keys() == entries(session(whole_run, step, stage)).keys()


def test_report_skips_the_cut_timing_line_with_a_warning(full_at_the_stop: Filled) -> None:
    run = full_at_the_stop
    lines = timing_lines(run.save_path)
    result = cli("report", str(run.save_path), "--json")
    assert result.returncode == 0, result.stderr
    log = run.save_path / "timing" / "rank0.jsonl"
    assert f"warning: {log}:{len(lines)}: the last line is cut short and was skipped" in result.stderr
    assert json.loads(result.stdout)["records"] == len(lines) - 1
    cut = session(run.save_path, 2, "actor_update")
    assert f"warning: {cut} is an incomplete msprobe session: cut off during step 2 actor_update" in result.stderr


def test_no_reader_prints_a_traceback_after_a_full_disk(
    full_at_the_stop: Filled, whole_run: Path, tmp_path: Path
) -> None:
    run = full_at_the_stop
    compare = cli("compare", str(run.save_path), str(whole_run), "--step", "2", "--stage", "actor_update")
    assert compare.returncode == 2
    assert "is an incomplete msprobe session" in compare.stderr
    check = check_save_path(tmp_path, run.save_path)
    assert check.returncode == 0
    assert "is an incomplete msprobe session: cut off during step 2 actor_update" in check.stdout
    report = cli("report", str(run.save_path))
    assert report.returncode == 0
    for result in (compare, check, report):
        assert "Traceback" not in result.stdout + result.stderr


@pytest.fixture
def full_before_the_periodic_save(tmp_path: Path) -> Iterator[Filled]:
    """Writes fail from step 1's actor_update at op 200 (401 entries) on:
    msprobe's periodic save at 1000 entries, inside the stage body, fails.
    (A full tmpfs does the same; the file size limit runs for any user.)"""
    yield from run_filled_at("file size limit", tmp_path, "1:200", 2)


def test_training_finishes_when_the_disk_fills_before_msprobes_periodic_save(
    full_before_the_periodic_save: Filled,
) -> None:
    run = full_before_the_periodic_save
    assert run.returncode == 0, run.stderr
    assert run.stdout.endswith("TRAINING FINISHED\n")
    assert marker(session(run.save_path, 1, "actor_update")) is not None
