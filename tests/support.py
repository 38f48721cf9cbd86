"""Helpers several test modules share (test modules import from here, never from each other)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl_events import AnomalyEvent, Observer, StageEnd, StageEvent, anomaly, current_installation, stage
from verl_events.testing import RecordingObserver

if TYPE_CHECKING:
    from verl_events.observers.sentinel import SpikeMargin


REPO = Path(__file__).resolve().parent.parent
VERL_DOC = (REPO / "docs/verl.md").read_text()
#: What a doc's main_ppo command writes for the reader's own arguments.
USUAL_ARGUMENTS = "...your usual arguments..."


# -- a doc's blocks and its main_ppo commands (docs/verl.md by default) --------------


@dataclass(frozen=True)
class DocCommand:
    env: dict[str, str]
    argv: list[str]


def doc_blocks(language: str, doc: str = VERL_DOC) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", doc, flags=re.S)


def doc_commands(marker: str, *, without: str = "\0", doc: str = VERL_DOC) -> list[DocCommand]:
    """The commands of the one main_ppo block of ``doc`` (docs/verl.md) that mentions ``marker``
    (and not ``without``)."""
    blocks = [b for b in doc_blocks("bash", doc) if "verl.trainer.main_ppo" in b and marker in b and without not in b]
    assert len(blocks) == 1, f"the doc should have one main_ppo block with {marker!r}, not {without!r}"
    commands = []
    for line in blocks[0].replace("\\\n", " ").splitlines():
        words = shlex.split(line.replace(USUAL_ARGUMENTS, ""))
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if words:
            commands.append(DocCommand(env, words))
    return commands


def on(root: Path, text: str) -> str:
    return text.replace("/shared/", f"{root}/")


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


class SentinelMarginsFile(Observer):
    """Writes the installed sentinel's spike margins (``SentinelObserver.margins()``) to
    ``{folder}/margins-{pid}.json`` at the end of every stage: for processes whose observers
    may never be closed (verl's Ray workers), where the sentinel's close-time log is lost.

    Its priority makes its end hook run after the sentinel's, so the file includes the
    stage's own values.
    """

    passive = True
    priority = 10

    def __init__(self, folder: str) -> None:
        self.path = Path(folder) / f"margins-{os.getpid()}.json"

    def on_stage_end(self, event: StageEnd) -> None:
        from verl_events.observers.sentinel import SentinelObserver

        installation = current_installation()
        sentinels = [o for o in installation.observers if isinstance(o, SentinelObserver)] if installation else []
        margins = [asdict(margin) for sentinel in sentinels for margin in sentinel.margins()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(margins))


def read_margins(folder: Path) -> list[SpikeMargin]:
    """The margins every process's :class:`SentinelMarginsFile` left in ``folder``."""
    from verl_events.observers.sentinel import SpikeMargin, SpikeRule

    found = []
    for path in sorted(Path(folder).glob("margins-*.json")):
        for data in json.loads(path.read_text()):
            found.append(SpikeMargin(**{**data, "rule": SpikeRule(**data["rule"])}))
    return found


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


#: The last line of a spawned gloo rank whose work is all written and closed.  With torch 2.13 a
#: finished gloo rank can abort in interpreter teardown ("terminate called without an active
#: exception", exit -6): one rank of the pair did in 10 of 20 runs of three plain-torch
#: all-reduces, and in 1 of 20 with verl_events installed.  Leaving without the teardown, as the
#: demo's ranks do (verl_events/apps/demo/tiny.py), judges a rank by the work it finished; the
#: exit function a normal end runs still releases multiprocessing's queues and semaphores.
LEAVE_WITHOUT_TEARDOWN = (
    "import multiprocessing.util; multiprocessing.util._exit_function(); "
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(0)"
)


def start_rank_pair(script: Path, run_id: str) -> list[subprocess.Popen[str]]:
    """Starts ``script RANK PORT`` as ranks 0 and 1 (a free port on 127.0.0.1, one run id),
    each a direct child of this process, so each exit code is seen; stdout and stderr are
    piped together.  :func:`end_processes` ends what is left."""
    port = str(free_port())
    env = {**os.environ, "VERL_EVENTS_RUN_ID": f"{run_id}-{port}"}
    return [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), port],
            cwd=script.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]


def end_processes(processes: list[subprocess.Popen[str]]) -> None:
    """Kills, by PID, each of ``processes`` still running, and reaps them all."""
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)


def run_as_printed(output: str, after: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command ``output`` prints after ``after`` (to the end of its line), run as a user
    pastes it into the shell the output was printed in: from ``cwd``, with this process's PATH."""
    line = next(line for line in output.splitlines() if after in line)
    command = line.split(after, 1)[1].strip()
    return subprocess.run(shlex.split(command), cwd=cwd, capture_output=True, text=True, timeout=300)


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
    ``sys.path``); it tears the group down itself, and each rank then leaves without the
    interpreter's teardown (:data:`LEAVE_WITHOUT_TEARDOWN`).  The script is written to
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
        f"    {LEAVE_WITHOUT_TEARDOWN}\n"
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


def tensorboard_scalars(directory: Path) -> dict[str, dict[int, float]]:
    """Every scalar of one TensorBoard run folder, by tag and step, as TensorBoard reads it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


class Sleeper(Observer):
    """Sleeps ``seconds`` in its begin hook at ``step``: a rank stuck inside a stage, for the watchdog."""

    passive = True

    def __init__(self, step: int, seconds: float) -> None:
        self.step, self.seconds = step, seconds

    def on_stage_begin(self, event: StageEvent) -> None:
        if event.step == self.step:
            time.sleep(self.seconds)


class Killer(Observer):
    """At ``step`` on ``rank``, sleeps ``seconds`` in its begin hook, then SIGKILLs its own process:
    a rank killed without warning (the OOM killer, a preemption) inside a stage.

    The sleep lets the watchdog's heartbeat (rewritten within ``heartbeat_s``) show the stage
    open; the watchdog's begin hook runs before this one (priority 900 against 0)."""

    passive = True

    def __init__(self, step: int, rank: int, seconds: float = 2.0) -> None:
        self.step, self.rank, self.seconds = step, rank, seconds

    def on_stage_begin(self, event: StageEvent) -> None:
        if event.step == self.step and event.rank == self.rank:
            time.sleep(self.seconds)
            os.kill(os.getpid(), signal.SIGKILL)


class Raiser(Observer):
    """At ``step`` on ``rank``, makes the stage's own forward raise ``RuntimeError(message)``: a
    forward hook on ``event.model``, removed when the stage ends.  The exception rises from the
    model's forward inside the stage's body, as a bug in a worker's code would."""

    passive = True

    def __init__(self, step: int, rank: int, message: str) -> None:
        self.step, self.rank, self.message = step, rank, message
        self._hooks: list[Any] = []

    def on_stage_begin(self, event: StageEvent) -> None:
        if event.step != self.step or event.rank != self.rank or event.model is None:
            return
        models = event.model if isinstance(event.model, list) else [event.model]
        self._hooks = [model.register_forward_hook(self._raise) for model in models]

    def _raise(self, module: object, inputs: object, output: object) -> None:
        raise RuntimeError(self.message)  # the line diagnose names

    def on_stage_end(self, event: StageEnd) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


class NaNInBaseWeight(Observer):
    """At ``step``'s ``update_weights``, a NaN in the first value of the actor's parameter whose
    name ends with ``parameter`` (a LoRA model's frozen base weight), put back when that sync
    ends: the sync carries it, the training after it does not (so the run is otherwise healthy)."""

    passive = True
    needs_model = True

    def __init__(self, step: int = 0, parameter: str = "q_proj.base_layer.weight") -> None:
        self.step, self.parameter = step, parameter
        self._undo: Any = None
        self._done = False

    def on_stage_begin(self, event: StageEvent) -> None:
        if self._done or event.stage != "update_weights" or event.step != self.step or event.model is None:
            return
        import torch

        module = event.model[0] if isinstance(event.model, (list, tuple)) else event.model
        weight = next(p for n, p in module.named_parameters() if n.endswith(self.parameter))
        local = weight.to_local() if hasattr(weight, "to_local") else weight  # an FSDP2 DTensor's shard
        with torch.no_grad():
            kept = local.view(-1)[0].item()
            local.view(-1)[0] = float("nan")
        self._undo = (local, kept)

    def on_stage_end(self, event: StageEnd) -> None:
        if self._undo is not None and event.stage == "update_weights" and event.step == self.step:
            import torch

            local, kept = self._undo
            with torch.no_grad():
                local.view(-1)[0] = kept
            self._undo, self._done = None, True
