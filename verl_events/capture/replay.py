"""Replay: a stage that changes no training state, run again right after it raised an anomaly.

The next-step capture of armed observers (:mod:`._arming`) finds faults that
persist.  A bad batch, a nondeterministic kernel or a flaky device show once:
by the next step they are gone.  So when a watcher (the sentinel) sends
``anomaly`` at the end of a replayable stage, the stage's body runs again, in
place, with the same arguments and the same model, and the armed capture
observers capture that run: its dump is the anomalous step itself.  The
replay's result is thrown away; the stage returns its own.

* Replayable: verl's forward-only stages (:data:`REPLAYABLE`), and a user's
  stage declared ``@emits_stage(..., replayable=True)``.  Such a stage must
  change no state, its arguments included: it returns its output rather than
  writing it into the batch it was given (verl's workers return a new
  DataProto), or training would see the replay's values.  Stages that change
  state or draw samples (:data:`STATE_CHANGES`) are never replayed by default;
  they keep the next-step capture.  A ``with stage(...)`` block cannot be run
  twice, so only decorated methods replay.
* On: when the installation has an observer with ``trigger: anomaly`` whose
  stages include the stage, unless the config says ``replay: false``.
* Agreed: an FSDP forward runs collectives, so all ranks replay or none.  At
  the end of every replayable stage an armed observer selects, each rank
  puts in whether an anomaly was sent during that stage, and one all-reduce
  (max) of one integer over the default process group decides.  The
  condition for taking part is the same on every rank (the config and the
  stage), so every rank runs the collective.  A stage whose body raised on a
  rank runs none there: the job is failing anyway.
* Bounded: an armed observer captures a replay only while it has captures
  left (``max_captures``); a stage is replayed only when one of them has.
* Seen by: armed capture observers and observers that set ``sees_replays``
  (the sentinel, which judges it); the event has ``replay=True`` and its
  outputs go to ``step_{N}/{stage}.replay``.  Nothing else sees a replay,
  so timings and trackers stay those of the training.
* A replay that raises is logged and goes no further.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterable

from verl_events.events.anomaly import AnomalyEvent
from verl_events.events.errors import VerlEventsWarning
from verl_events.events.process import PROCESS

from .arming import Arming, max_over_ranks

logger = logging.getLogger("verl_events")

#: verl's stages that only read the model: replayed by default.
REPLAYABLE = frozenset({"actor_compute_log_prob", "ref_compute_log_prob", "compute_values", "compute_rm_score"})

#: Stages that are never replayed by default, and the state each changes.
STATE_CHANGES = {
    "actor_update": "updates the actor's weights and optimizer state",
    "critic_update": "updates the critic's weights and optimizer state",
    "train_batch": "updates the model's weights and optimizer state",
    "forward_backward": "accumulates gradients",
    "rollout_generate": "draws new samples and advances the random state",
}


def replayable(name: str, declared: bool | None) -> bool:
    """Whether ``@emits_stage(name, replayable=declared)`` replays; warns when
    a stage that changes state is declared replayable."""
    if declared is None:
        return name in REPLAYABLE
    if declared and name in STATE_CHANGES:
        warnings.warn(
            f"emits_stage({name!r}, replayable=True): {name} {STATE_CHANGES[name]}, so a replay runs that "
            "change twice; replay only a stage that changes no state, or leave replayable unset",
            VerlEventsWarning,
            stacklevel=3,
        )
    return declared


class ReplayPlan:
    """One installation's replay decisions: which stages take part, and
    whether an anomaly was sent during the stage that just ended."""

    def __init__(self, armings: Iterable[Arming], stages: frozenset[str] | None) -> None:
        self.armings = tuple(armings)
        self.stages = stages  # stages some armed observer selects; None: any
        self._sent = threading.local()  # (stage, step) of the last anomaly sent on this thread

    def on_anomaly(self, event: AnomalyEvent) -> None:
        """Remember the anomaly on its thread; the dispatcher hands it over
        before any observer's hook."""
        # Sent from the end hooks of the stage that raised it, on its thread.
        self._sent.last = (event.stage, event.step)

    def agrees(self, stage: str, step: int | None) -> bool:
        """At the end of a replayable stage: whether every rank replays it
        (a collective, when an armed observer selects the stage)."""
        if step is None or (self.stages is not None and stage not in self.stages):
            return False
        sent, self._sent.last = getattr(self._sent, "last", None), None
        replay = max_over_ranks(int(sent == (stage, step))) > 0
        return replay and any(arming.has_room() for arming in self.armings)


def active() -> ReplayPlan | None:
    """The installed plan, or None when nothing replays."""
    plan: ReplayPlan | None = PROCESS.replay
    return plan


def activate(plan: ReplayPlan | None) -> None:
    PROCESS.replay = plan
