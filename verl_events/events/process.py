"""What this process remembers between calls: one object, :data:`PROCESS`.

Everything else the core keeps lives on an installation, an event, or a thread's stack of
open stages.  What must outlive a call is here, in one place, so that
:func:`verl_events.testing.reset` puts a process back as a fresh one has it with one call
(:meth:`ProcessState.reset`), and a reader finds it without hunting module globals.  Each
field is owned by one module, which reads and writes it; the field says which.  The fields
are typed loosely where their types live above this module (the installation, the replay
plan, the bridge): their owners hand them out typed.  Each owner keeps its own lock: one
lock for all would tie set-up (which starts threads) to every other thread's bookkeeping.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PROCESS", "ProcessState"]


@dataclass
class ProcessState:
    """This process's state; see the module docstring."""

    #: verl_events.setup.install: the open Installation, or None.
    installation: Any = None
    #: verl_events.capture.replay: the installed ReplayPlan, or None.
    replay: Any = None
    #: verl_events.bus.emit: each stage event's number, unique in the process (next() on a
    #: count is atomic under the GIL); never reset, so numbers never repeat.
    seq: Iterator[int] = field(default_factory=lambda: itertools.count(1), repr=False)
    #: verl_events.bus.resolve: the step set_step announced.
    announced_step: int | None = None
    #: verl_events.bus.resolve: add_model_paths' paths, by role (None: every role).
    model_paths: dict[str | None, tuple[str, ...]] = field(default_factory=dict)
    #: verl_events.bus.resolve: environment variables already warned about.
    warned_env: set[str] = field(default_factory=set)
    #: verl_events.bus.weights: who watches the weight syncs' payloads.
    payload_watchers: list[Any] = field(default_factory=list)
    #: verl_events.bus.progress: who is told how the trainer's loop ended.
    progress_watchers: list[Any] = field(default_factory=list)
    #: verl_events.run.identity: the run id this process made up (exported for its children).
    run_id_made: str | None = None
    #: verl_events.run.identity: the environment variable the made-up run id is exported in.
    run_id_env: str = "VERL_EVENTS_RUN_ID"
    #: verl_events.setup.interrupts: SIGINT watches left in a handler chain.
    sigint_watches: list[Any] = field(default_factory=list)
    #: verl_events.verl_bridge: the installed bridge, or None.
    verl_bridge: Any = None
    #: verl_events.bus.stack: each thread's own (its stack of open stages, the result asked for).
    threads: threading.local = field(default_factory=threading.local, repr=False)
    #: verl_events.events.listened: (signal name, receiver key) -> the stage names it listens for.
    #: It mirrors blinker's receivers, so :meth:`reset` leaves it.
    connections: dict[tuple[str, Any], set[Any]] = field(default_factory=dict)

    def reset(self) -> None:
        """Back to a fresh process: the installation closed, no replay, no announced step,
        no added model paths, no payload or progress watcher, no warning remembered, and no run id made
        up here (so the next run gets a new one).  The verl bridge, the SIGINT chain and the
        record of blinker's receivers mirror what is installed outside us, and each thread's
        stack what runs on it: left as they are.
        For test fixtures, between tests: no other thread may be emitting meanwhile."""
        if self.installation is not None:
            self.installation.close()
        self.installation = None
        self.replay = None
        self.announced_step = None
        self.model_paths.clear()
        self.warned_env.clear()
        self.payload_watchers.clear()
        self.progress_watchers.clear()
        if self.run_id_made is not None and os.environ.get(self.run_id_env) == self.run_id_made:
            del os.environ[self.run_id_env]
        self.run_id_made = None


#: The one state of this process.
PROCESS = ProcessState()
