"""How a watched process ends: a raising stage, terminating and fatal signals, the liveness beat,
and the last heartbeat.  Signals and faulthandler are real: a process is sent SIGTERM, one really
segfaults (ctypes reads address 0)."""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import FrameType

import pytest

import verl_events
from verl_events.observers.timing import TimingRecord
from verl_events.observers.watchdog.crash import (
    CrashRecord,
    ProcessEnd,
    crash_log_path,
    ends_log_path,
    fatal_files,
    fatal_path,
    read_fatal,
)
from verl_events.observers.watchdog.record import heartbeat_path, read_heartbeat

REPO = Path(__file__).resolve().parents[2]


def config(save_path: Path, **options: object) -> dict[str, object]:
    watchdog = {"name": "watchdog", "heartbeat_s": 0.05, **options}
    return {"save_path": str(save_path), "observers": [watchdog, {"name": "timing"}]}


def crash_records(save_path: Path, rank: int = 0) -> list[CrashRecord]:
    path = crash_log_path(save_path, rank)
    return [CrashRecord.from_json(line) for line in path.read_text().splitlines()] if path.exists() else []


def raise_inside() -> None:
    raise RuntimeError("the reward model returned 3 scores for 4 samples")


def test_a_stage_that_raises_is_recorded_once_with_its_message_line_and_traceback(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), verl_events.install(config(tmp_path)):
        with verl_events.stage("actor_update", step=2), verl_events.stage("train_batch", step=2):
            raise_inside()
    (record,) = crash_records(tmp_path)  # once: the innermost stage, not again for actor_update
    assert (record.kind, record.step, record.stage, record.error_type) == (
        "exception",
        2,
        "train_batch",
        "RuntimeError",
    )
    assert record.parent == "actor_update"
    assert record.message == "the reward model returned 3 scores for 4 samples"
    assert record.pid == os.getpid()
    assert record.where is not None and record.where["file"] == __file__
    assert record.where["function"] == "raise_inside" and record.where["code"].startswith("raise RuntimeError")
    assert record.traceback is not None and "raise_inside()" in record.traceback
    timing = [TimingRecord.from_json(line) for line in (tmp_path / "timing/rank0.jsonl").read_text().splitlines()]
    assert {(t.stage, t.error, t.message) for t in timing} == {
        (stage, "RuntimeError", "the reward model returned 3 scores for 4 samples")
        for stage in ("actor_update", "train_batch")
    }
    beat = read_heartbeat(heartbeat_path(tmp_path, 0))
    assert beat.closed and beat.exit is not None and beat.exit["how"] == "exception"
    assert "the reward model" in beat.exit["detail"]


def test_a_clean_end_says_so_and_leaves_no_crash_files(tmp_path: Path) -> None:
    with verl_events.install(config(tmp_path)):
        with verl_events.stage("actor_update", step=1):
            pass
    beat = read_heartbeat(heartbeat_path(tmp_path, 0))
    assert beat.closed and beat.exit == {"how": "normal", "detail": None}
    assert beat.pid == os.getpid() and beat.liveness_s == 2.0
    # the empty dumps are removed at close; what is left says how the process ended
    assert [path.name for path in (tmp_path / "crashes").iterdir()] == ["ends.jsonl"]
    (end,) = [ProcessEnd.from_json(line) for line in ends_log_path(tmp_path).read_text().splitlines()]
    assert (end.how, end.ranks, end.pid) == ("normal", [0], os.getpid())


def test_the_liveness_beat_rewrites_an_unchanged_heartbeat(tmp_path: Path) -> None:
    with verl_events.install(config(tmp_path, liveness_s=0.2)):
        with verl_events.stage("actor_update", step=1):
            time.sleep(0.3)
            first = read_heartbeat(heartbeat_path(tmp_path, 0)).time
            time.sleep(0.6)
            second = read_heartbeat(heartbeat_path(tmp_path, 0))
    assert second.time > first and not second.closed
    assert [item["stage"] for item in second.open] == ["actor_update"]


def test_an_unchanged_heartbeat_beats_by_its_mtime_and_is_rewritten_whole_once_removed(tmp_path: Path) -> None:
    path = heartbeat_path(tmp_path, 0)
    with verl_events.install(config(tmp_path, liveness_s=0.2)):
        with verl_events.stage("actor_update", step=1):
            time.sleep(0.3)
            written = path.read_bytes()
            time.sleep(0.6)  # liveness beats meanwhile, nothing changes
            kept, beat = path.read_bytes(), read_heartbeat(path)
            path.unlink()
            time.sleep(0.6)
            again = read_heartbeat(path)
    assert kept == written  # the liveness beats did not rewrite it ...
    assert beat.mtime_beats and beat.time > json.loads(written)["time"]  # ... they set its mtime, read as its time
    assert [item["stage"] for item in again.open] == ["actor_update"] and not again.closed


def test_faulthandler_is_restored_at_close(tmp_path: Path) -> None:
    was = faulthandler.is_enabled()
    with verl_events.install(config(tmp_path)):
        assert faulthandler.is_enabled()
    assert faulthandler.is_enabled() == was


def test_sigterm_is_recorded_then_the_users_handler_runs_and_is_put_back(tmp_path: Path) -> None:
    called: list[int] = []

    def users_handler(number: int, frame: FrameType | None) -> None:
        called.append(number)

    previous = signal.signal(signal.SIGTERM, users_handler)
    try:
        with verl_events.install(config(tmp_path)):
            with verl_events.stage("actor_update", step=3):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler runs between bytecodes of this thread
            assert called == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is users_handler  # ours is gone, theirs is back
    finally:
        signal.signal(signal.SIGTERM, previous)
    (record,) = crash_records(tmp_path)
    assert (record.kind, record.signal, record.step, record.stage) == ("signal", "SIGTERM", 3, "actor_update")
    assert [item["stage"] for item in record.open] == ["actor_update"]
    # The user's handler returned and the process went on to a normal end: its last word says so.
    assert read_heartbeat(heartbeat_path(tmp_path, 0)).exit == {"how": "normal", "detail": None}
    ends = [ProcessEnd.from_json(line) for line in ends_log_path(tmp_path).read_text().splitlines()]
    assert [(end.how, end.detail) for end in ends] == [("signal", "SIGTERM"), ("normal", None)]


def test_a_handler_set_after_ours_that_chains_to_it_still_gets_ctrl_c_after_close(tmp_path: Path) -> None:
    """Closing must not leave a library that chained to our handler with a Ctrl-C that does nothing."""
    previous = signal.getsignal(signal.SIGINT)
    try:
        with verl_events.install(config(tmp_path)):
            with verl_events.stage("actor_update", step=1):
                pass
            ours = signal.getsignal(signal.SIGINT)
            assert callable(ours)

            def library_handler(number: int, frame: FrameType | None) -> None:
                ours(number, frame)  # a library that chains to whatever was there before it

            signal.signal(signal.SIGINT, library_handler)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs between bytecodes of this thread
    finally:
        signal.signal(signal.SIGINT, previous)


DYING = """\
import ctypes, os, signal, sys, time
sys.path.insert(0, {repo!r})
import verl_events

with verl_events.install({{"save_path": {save_path!r}, "observers": [{{"name": "watchdog", "heartbeat_s": 0.05}}]}}):
    with verl_events.stage("actor_update", step=2, rank=1):
        time.sleep(0.3)
{body}
"""


def run_dying(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "dying.py"
    script.write_text(
        DYING.format(repo=str(REPO), save_path=str(tmp_path / "run"), body=textwrap.indent(body, " " * 8))
    )
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_a_segfault_leaves_every_threads_stack_and_still_ends_by_sigsegv(tmp_path: Path) -> None:
    done = run_dying(tmp_path, "ctypes.string_at(0)  # reads address 0\n")
    assert done.returncode == -signal.SIGSEGV, done.stderr
    (path,) = fatal_files(tmp_path / "run", written=True)
    assert path.name == "rank1.fatal.txt"  # renamed from the pid's name once the first stage ran
    dump = read_fatal(path)
    assert dump is not None and (dump.signal, dump.rank) == ("SIGSEGV", 1)
    assert (str(tmp_path / "dying.py"), 8) in [(file, line) for file, line, _ in dump.current]


@pytest.mark.slow
def test_sigterm_with_the_default_action_leaves_the_stacks_and_ends_the_process_by_sigterm(tmp_path: Path) -> None:
    done = run_dying(tmp_path, "os.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)\n")
    assert done.returncode == -signal.SIGTERM, done.stderr  # exactly as without the watchdog
    (path,) = fatal_files(tmp_path / "run", written=True)
    assert path.name == "rank1.SIGTERM.txt"
    dump = read_fatal(path)
    assert dump is not None and (dump.signal, dump.rank, dump.error) == ("SIGTERM", 1, "terminated by SIGTERM")
    main_thread = [
        frames
        for frames in dump.threads.values()
        if (str(tmp_path / "dying.py"), 8) in [(file, line) for file, line, _ in frames]
    ]
    assert main_thread, dump.threads  # the stage's thread was at the kill
    beat = json.loads(heartbeat_path(tmp_path / "run", 1).read_text())
    assert not beat["closed"] and [item["stage"] for item in beat["open"]] == ["actor_update"]


@pytest.mark.slow
def test_sigterm_still_ends_a_process_whose_main_thread_is_blocked_in_c(tmp_path: Path) -> None:
    """A Python handler would wait for the main thread to come back to Python: a rank blocked in a
    collective would stop dying of SIGTERM.  Here the main thread waits in a C call (a lock with no
    timeout, as a gloo or NCCL wait does) and another thread sends the signal."""
    body = """import threading
lock = threading.Lock()
lock.acquire()
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
lock.acquire()  # blocks in C for ever
"""
    done = run_dying(tmp_path, body)
    assert done.returncode == -signal.SIGTERM, done.stderr
    dump = read_fatal(fatal_path(tmp_path / "run", rank=1, signal="SIGTERM"))
    assert dump is not None and any(
        (str(tmp_path / "dying.py"), 12) in [(file, line) for file, line, _ in frames]
        for frames in dump.threads.values()
    )


@pytest.mark.parametrize(("code", "how"), [(0, "normal"), (None, "normal"), (3, "exception")])
def test_sys_exit_is_a_normal_end_only_with_a_zero_code(tmp_path: Path, code: int | None, how: str) -> None:
    with pytest.raises(SystemExit), verl_events.install(config(tmp_path)):
        with verl_events.stage("actor_update", step=1):
            pass
        sys.exit(code)
    (end,) = [ProcessEnd.from_json(line) for line in ends_log_path(tmp_path).read_text().splitlines()]
    assert end.how == how and (end.detail == "SystemExit: 3" if code == 3 else end.detail is None)
    assert read_heartbeat(heartbeat_path(tmp_path, 0)).exit == {"how": how, "detail": end.detail}
