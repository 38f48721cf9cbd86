"""Helpers several test modules share (test modules import from here, never from each other)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from verl_events import Observer, StageEnd, StageEvent, stage
from verl_events._anomaly import AnomalyEvent, anomaly
from verl_events.testing import RecordingObserver


def make_event(**overrides: object) -> StageEvent:
    fields = dict(stage="actor_update", role="actor", step=1, rank=0, world_size=1)
    fields.update(overrides)
    return StageEvent(**fields)  # type: ignore[arg-type]


class Capturing(RecordingObserver):
    """A recording observer that counts as a capture tool."""

    captures = True


class Watcher(Observer):
    """Sends an anomaly at the end of the stages of ``bad_steps``."""

    sends_anomalies = True
    passive = True

    def __init__(self, bad_steps: list[int]) -> None:
        self.bad_steps = set(bad_steps)

    def on_stage_end(self, event: StageEnd) -> None:
        if event.step in self.bad_steps:
            anomaly.send(
                event.stage,
                event=AnomalyEvent(event.step, event.stage, event.rank, "loss", float("nan"), "non_finite"),
            )


def run_steps(steps: range, stages: tuple[str, ...] = ("actor_compute_log_prob", "actor_update")) -> None:
    for step in steps:
        for name in stages:
            with stage(name, step=step):
                pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (the OS's pick for port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def verl_events_exe() -> str:
    """The ``verl-events`` command installed next to this interpreter."""
    exe = shutil.which("verl-events", path=str(Path(sys.executable).parent))
    assert exe is not None, "verl-events is not installed in this venv"
    return exe


def run_two_gloo_ranks(directory: Path, rank_body: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Runs ``rank_body`` in two processes spawned by torch.multiprocessing, as ranks 0 and 1
    of a gloo process group on 127.0.0.1 and a free port.

    ``rank_body`` is the body of ``rank_main(rank)``, run after ``init_process_group``
    (``json``, ``os``, ``sys``, ``dist`` and ``mp`` are imported, and the repository is on
    ``sys.path``); it tears the group down itself.  The script is written to
    ``directory/two_ranks.py`` and run there."""
    body = textwrap.indent(textwrap.dedent(rank_body).strip("\n"), "    ")
    repo = str(Path(__file__).resolve().parents[1])
    script = (
        "import json, os, sys\n"
        "import torch.distributed as dist, torch.multiprocessing as mp\n"
        f"sys.path.insert(0, {repo!r})\n"
        "\n"
        "def rank_main(rank):\n"
        '    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])\n'
        '    dist.init_process_group("gloo", rank=rank, world_size=2)\n'
        f"{body}\n"
        "\n"
        'if __name__ == "__main__":\n'
        "    mp.spawn(rank_main, nprocs=2)\n"
    )
    (directory / "two_ranks.py").write_text(script)
    return subprocess.run(
        [sys.executable, "two_ranks.py", str(free_port())],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
