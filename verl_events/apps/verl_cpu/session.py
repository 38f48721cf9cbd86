"""Running verl's trainer in a session of its own, and leaving no process of it behind.

The trainer starts a local Ray cluster whose worker processes outlive the driver by a
few seconds; they stay in the driver's session, so waiting for the session to empty
(then killing, by PID, whatever remains) leaves no Ray process behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from .trainer_log import LogFollower

__all__ = ["reap_session", "run_in_own_session", "session_members"]


def run_in_own_session(
    cmd: Sequence[str],
    env: Mapping[str, str],
    output: IO[str] | None = None,
    *,
    timeout: float | None = None,
    follower: LogFollower | None = None,
) -> int:
    """Run ``cmd`` in a new session, its output to ``output`` (default: ours), and wait
    until the session is empty; return its exit code.  ``follower`` reads the output
    file as it grows.  Past ``timeout`` seconds every process of the session is
    killed and :class:`subprocess.TimeoutExpired` raised."""
    proc = subprocess.Popen(list(cmd), env=dict(env), start_new_session=True, stdout=output, stderr=output)
    try:
        return proc.wait(timeout) if follower is None else _wait_following(proc, follower, timeout)
    except subprocess.TimeoutExpired:
        reap_session(proc.pid, timeout=0)  # hung: kill every process of the run now
        proc.wait()
        raise
    except KeyboardInterrupt:
        # The child no longer shares the terminal's process group: pass the interrupt on.
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    finally:
        reap_session(proc.pid)


def _wait_following(proc: subprocess.Popen[bytes], follower: LogFollower, timeout: float | None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
        try:
            code = proc.wait(max(left, 0))
        except subprocess.TimeoutExpired:
            follower.poll()
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout or 0) from None
            continue
        follower.poll(final=True)
        return code


def session_members(sid: int) -> list[int]:
    """The live processes of session ``sid`` (zombies left out: they hold nothing and cannot be killed)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # Fields after "(comm)": state, ppid, pgrp, session, ...
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def reap_session(sid: int, timeout: float = 30.0) -> None:
    """Wait up to ``timeout`` for session ``sid`` to empty, then kill what is left, by PID."""
    if not Path("/proc/self/stat").exists():  # not Linux: nothing to inspect
        return
    deadline = time.monotonic() + timeout
    while (members := session_members(sid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
