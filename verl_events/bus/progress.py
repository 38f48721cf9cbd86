"""How far the trainer's loop went, told by verl's driver when its ``fit`` returns.

A resumed run that exits 0 without the updates it was asked for looks like a run that
finished (verl #7401, #5725).  Only the driver knows both numbers: the step it resumed
from (set by its ``_load_checkpoint``) and the step its loop reached.  The verl bridge
(:mod:`verl_events.verl.training`) calls :func:`loop_ended` when ``fit`` returns normally;
a watcher (the ``checkpoint`` observer) judges it.  A ``fit`` that raised tells nobody:
the exception is the run's failure, and the watchdog's records say so.

A watcher that raises is logged and passed over; the others are still told.  Standard
library only.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol

from verl_events.events.process import PROCESS

__all__ = ["LoopEnded", "ProgressWatcher", "loop_ended", "unwatch_progress", "watch_progress"]

logger = logging.getLogger("verl_events.progress")


@dataclass(frozen=True, slots=True)
class LoopEnded:
    """The trainer's loop, as the driver left it.

    ``resumed_from``: the step of the checkpoint the driver loaded (None: it started fresh);
    ``total_steps``: the run's ``total_training_steps``, the last step it was asked to
    train (None when the trainer has none); ``last_step``: the last step its loop
    finished (0 when none: verl counts ``global_steps`` from 1).
    """

    resumed_from: int | None
    total_steps: int | None
    last_step: int

    @property
    def trained(self) -> int:
        """How many steps the loop finished in this run."""
        return max(0, self.last_step - (self.resumed_from or 0))

    @property
    def asked(self) -> int | None:
        """How many steps this run was asked to train (None: unknown)."""
        if self.total_steps is None:
            return None
        return max(0, self.total_steps - (self.resumed_from or 0))


class ProgressWatcher(Protocol):
    def loop_ended(self, ended: LoopEnded) -> None: ...


_lock = threading.Lock()


def watch_progress(watcher: ProgressWatcher) -> None:
    """Tell ``watcher`` of every trainer loop that ends from now on."""
    with _lock:
        if watcher not in PROCESS.progress_watchers:
            PROCESS.progress_watchers.append(watcher)


def unwatch_progress(watcher: ProgressWatcher) -> None:
    with _lock:
        if watcher in PROCESS.progress_watchers:
            PROCESS.progress_watchers.remove(watcher)


def loop_ended(ended: LoopEnded) -> None:
    """Tell every watcher how the loop ended; a watcher that raises is logged."""
    with _lock:
        watchers: list[ProgressWatcher] = list(PROCESS.progress_watchers)
    for watcher in watchers:
        try:
            watcher.loop_ended(ended)
        except Exception:
            logger.exception("verl_events: %s failed on the trainer loop's end", type(watcher).__name__)
