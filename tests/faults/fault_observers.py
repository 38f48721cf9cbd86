"""Observers the fault tests load by import path (``_target_: fault_observers:...``)
into processes they start: the driver, or ``verl-events demo``."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from verl_events import InstallContext, Observer, StageEnd, StageEvent, stage_output_dir
from verl_events.layout import stage_dirs

#: How long an Interrupter waits for its signal before giving up.
WAIT_S = 120


class AlwaysFails(Observer):
    """Raises in every hook it has: both stage hooks and close."""

    def on_stage_begin(self, event: StageEvent) -> None:
        raise RuntimeError(f"begin of {event.stage} step {event.step} broke")

    def on_stage_end(self, event: StageEnd) -> None:
        raise RuntimeError(f"end of {event.stage} step {event.step} broke")

    def close(self) -> None:
        raise RuntimeError("close broke")


def wait_for_a_signal(moment: str) -> None:
    """Print ``WAITING <moment>`` on stdout and wait until a signal's handler
    raises (Ctrl-C: KeyboardInterrupt).  Short sleeps, not one long one: a
    signal that lands just before a long sleep starts would wait it out."""
    print(f"WAITING {moment}", flush=True)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise TimeoutError(f"no signal came within {WAIT_S} s at {moment}")


class Interrupter(Observer):
    """Stops its process at one moment and waits there for the test's signal.

    ``moment``: ``install`` (in its own setup, before any stage) or ``body``
    (in the body of each selected stage: a forward pre-hook on the last
    submodule of the stage's model, so the wait is half-way through the
    model's first forward call).  Passive: the
    stages it watches do not count as profiled.
    """

    passive = True

    def __init__(self, moment: str = "body") -> None:
        if moment not in ("install", "body"):
            raise ValueError(f"moment: {moment!r} is not allowed; use install or body")
        self.moment = moment
        self._hook: Any = None

    def setup(self, context: InstallContext) -> None:
        if self.moment == "install":
            wait_for_a_signal("install")

    def on_stage_begin(self, event: StageEvent) -> None:
        if self.moment == "body":
            where = f"body of step {event.step} {event.stage}"
            last = list(event.model.modules())[-1]
            self._hook = last.register_forward_pre_hook(lambda module, args: wait_for_a_signal(where))

    def on_stage_end(self, event: StageEnd) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


class RunNote(Observer):
    """A third-party writer: appends the id of the run that wrote it to
    ``{stage dir}/note_rank{R}.txt`` at each stage's end, and declares those
    files in ``outputs``, as any observer that writes under save_path does."""

    output_noun = "run note(s)"

    def __init__(self) -> None:
        self._root = Path()

    def outputs(self, save_path: Path) -> list[Path]:
        return sorted(path for stage in stage_dirs(save_path) for path in stage.glob("note_rank*.txt"))

    def setup(self, context: InstallContext) -> None:
        self._root = context.save_path

    def on_stage_end(self, event: StageEnd) -> None:
        note = stage_output_dir(self._root, event) / f"note_rank{event.rank}.txt"
        note.parent.mkdir(parents=True, exist_ok=True)
        with note.open("a", encoding="utf-8") as handle:
            handle.write(os.environ.get("VERL_EVENTS_RUN_ID", "?") + "\n")
