"""Two gloo ranks under the watchdog, for the hang and stall tests (tests/test_hangs.py,
tests/test_progress.py): the script each rank runs, the fixture that starts them, and helpers."""

from __future__ import annotations

import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import end_processes, start_rank_pair

__all__ = ["DEADLINE", "RANK_SCRIPT", "gloo_ranks", "line_of", "wait_for"]

DEADLINE = 2.0  # seconds: the watchdog's timeout_s in the two-rank runs


def wait_for(condition: object, timeout: float) -> None:
    """Poll ``condition()`` every 0.1 s until it is true; fail after ``timeout`` seconds."""
    give_up = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < give_up, f"still waiting after {timeout} s"
        time.sleep(0.1)


RANK_SCRIPT = """\
import os, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, {repo!r})
import verl_events

rank = int(sys.argv[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=rank, world_size=2)
config = {{"save_path": {save_path!r}, "observers": [
    {{"name": "watchdog", "timeout_s": {deadline}, "heartbeat_s": 0.2, "action": {action!r}{options}}}]}}
with verl_events.install(config):
{body}
dist.destroy_process_group()
"""


@pytest.fixture
def gloo_ranks(tmp_path: Path) -> Iterator[object]:
    """Starts two processes as ranks 0 and 1 of a gloo group (``start(body, action, **options)``;
    ``body`` runs inside ``verl_events.install`` of a watchdog with ``timeout_s`` DEADLINE and
    ``options``, with ``rank``, ``time``, ``torch``, ``dist`` and ``verl_events`` at hand).  Each rank is a direct
    child, so each exit code is seen and anything left at the end is killed by its PID."""
    started: list[subprocess.Popen[str]] = []

    def start(body: str, action: str = "report", **options: object) -> list[subprocess.Popen[str]]:
        script = tmp_path / "two_ranks.py"
        script.write_text(
            RANK_SCRIPT.format(
                repo=str(Path(__file__).resolve().parents[1]),
                save_path=str(tmp_path / "run"),
                deadline=DEADLINE,
                action=action,
                options="".join(f", {key!r}: {value!r}" for key, value in options.items()),
                body=textwrap.indent(textwrap.dedent(body).strip("\n"), "    "),
            )
        )
        started.extend(start_rank_pair(script, "hangs-test"))
        return started

    yield start
    end_processes(started)


def line_of(script: Path, text: str) -> int:
    """The number of ``script``'s first line that holds ``text``."""
    return next(n for n, line in enumerate(script.read_text().splitlines(), 1) if text in line)
