"""A rank killed by the kernel's OOM killer, for real, and what diagnose makes of it (issue 28).

The rank runs in a memory cgroup of its own with a limit (a child of this process's cgroup,
made for the test and removed after it; skipped where it cannot be made: not root, or no
writable memory controller).  Inside step 2's actor_update it allocates until the kernel
kills it (SIGKILL: no Python runs, nothing is written).  The memory observer's last record
(step 1's) names the cgroup; diagnose reads that cgroup's OOM-kill count again and finds it
rose since.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from verl_events.apps.cli import main as verl_events_main
from verl_events.observers.memory.cgroup import find_cgroup

from .support import REPO

pytestmark = pytest.mark.slow

LIMIT = 600 * 2**20  # above what torch's import holds, far below what step 2 asks

RANK = """\
import sys, time
with open({procs!r}, "w") as procs:  # into the limited cgroup before anything big is loaded
    procs.write("0")
sys.path.insert(0, {repo!r})
import torch
import verl_events

config = {{"save_path": {save_path!r}, "observers": [
    {{"name": "watchdog", "heartbeat_s": 0.1, "liveness_s": 0.5}}, {{"name": "memory"}}]}}
with verl_events.install(config):
    with verl_events.stage("actor_update", role="actor", step=1, rank=0):
        torch.ones(1000)
    # The heartbeat names the rank from its first stage on: a process killed before the
    # watchdog's first beat leaves nothing to read (docs/memory.md), which is not this test.
    time.sleep(1.0)
    held = []
    with verl_events.stage("actor_update", role="actor", step=2, rank=0):
        while True:
            held.append(torch.ones(2**23))  # 32 MB at a time, touched, kept
            time.sleep(0.02)
"""


@pytest.fixture
def limited_cgroup() -> Iterator[Path]:
    found = find_cgroup()
    if found is None:
        pytest.skip("this process is in no memory cgroup that can be read")
    version, folder = found
    child = folder / f"verl-events-test-{os.getpid()}"
    limit_file = "memory.limit_in_bytes" if version == 1 else "memory.max"
    try:
        child.mkdir()
    except OSError as exc:
        pytest.skip(f"a child memory cgroup cannot be made here ({exc.strerror})")
    try:
        if not (child / limit_file).exists():
            pytest.skip("the memory controller is not enabled for child cgroups here")
        (child / limit_file).write_text(str(LIMIT))
        swap = child / "memory.memsw.limit_in_bytes"  # v1 with swap accounting: no way out through swap
        if swap.exists():
            swap.write_text(str(LIMIT))
        yield child
    finally:
        child.rmdir()  # empty again: the rank is dead


def test_a_rank_the_oom_killer_ends_is_named_killed_most_likely_by_the_oom_killer(
    tmp_path: Path, limited_cgroup: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "rank.py"
    save_path = tmp_path / "run"
    script.write_text(RANK.format(procs=str(limited_cgroup / "cgroup.procs"), repo=str(REPO), save_path=str(save_path)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr[-3000:])
    assert verl_events_main(["diagnose", str(save_path), "--json"]) == 1
    first = json.loads(capsys.readouterr().out)["first"]
    assert (first["kind"], first["rank"], first["step"], first["stage"]) == ("killed", 0, 2, "actor_update")
    assert first["detail"].startswith(
        "most likely killed by the OOM killer: its cgroup counts 1 OOM kill(s) since its last record; "
        "at the end of actor_update (step 1) the process held "
    ), first["detail"]
