"""The typed records that travel on the bus, and the stage vocabulary."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .errors import ConfigError

#: Stages verl's workers run, in the order they run within a step (tables
#: list stages this way), mapped to the role that runs them.  verl 0.9's
#: engine workers add ``train_batch`` (the critic's and trainer's update) and
#: ``forward_backward``; they have no fixed role.  ``rollout_prefill`` is a
#: rollout server running the trainer's sequences for the mismatch observer's
#: layer profile (docs/mismatch.md), right after ``actor_compute_log_prob``.
#: verl's transitions are stages too (``verl_events.verl.transitions``): a
#: resumed run's ``load_checkpoint`` comes first; ``rollout_generate`` is the
#: driver waiting for the step's generation (``rollout_validate`` for a
#: validation's, after the step); after the update,
#: ``save_checkpoint`` (when verl saves that step) and the ``update_weights``
#: sync, in which the rollout wakes up.  The checkpoints are the actor's or the
#: critic's: no fixed role.
STAGE_ROLES: Mapping[str, str | None] = MappingProxyType(
    {
        "load_checkpoint": None,
        "rollout_generate": "rollout",
        "ref_compute_log_prob": "ref",
        "actor_compute_log_prob": "actor",
        "rollout_prefill": "rollout",
        "compute_values": "critic",
        "critic_update": "critic",
        "compute_rm_score": "reward_model",
        "actor_update": "actor",
        "save_checkpoint": None,
        "update_weights": "actor",
        "rollout_wake_up": "rollout",
        "rollout_validate": "rollout",
        "train_batch": None,
        "forward_backward": None,
    }
)

#: The rank of verl's driver (the ``TaskRunner`` process that runs the trainer's
#: loop), which is no trainer rank.  Its stages (the wait for generation) are
#: filed under this number, so its per-rank files (``rank-1.jsonl``) never mix
#: with trainer rank 0's.  Readers call it ``driver`` (:func:`rank_name`).
DRIVER_RANK = -1


def rank_name(rank: int, *, compact: bool = False) -> str:
    """How people read a rank: ``rank 3`` (``rank3`` in a table cell), or ``driver`` for
    :data:`DRIVER_RANK`."""
    if rank == DRIVER_RANK:
        return "driver"
    return f"rank{rank}" if compact else f"rank {rank}"


EMPTY_META: Mapping[str, Any] = MappingProxyType({})

# A stage name becomes a directory name (``step_3/actor_update``), and msprobe
# rejects any path outside ``[A-Za-z0-9_.:/-]``.  No separators, no ``..``.
_STAGE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def check_stage_name(name: object, *, where: str = "stage") -> str:
    """Return ``name`` if it is usable as a stage name, else raise ConfigError."""
    if not isinstance(name, str) or not _STAGE_NAME.match(name) or set(name) == {"."}:
        raise ConfigError(
            f"{where}: {name!r} is not a valid stage name; a stage name becomes a "
            "directory name, so it must be a non-empty string of letters, digits, "
            "'_', '-' or '.', without '/' and not '.' or '..'"
        )
    return name


@dataclass(frozen=True, slots=True)
class StageEvent:
    """A stage is starting: what runs, where, and on which model.

    ``step`` is verl's 1-based global step, or None when it could not be
    resolved.  ``model`` is an ``nn.Module``, a list of model chunks, or None.
    ``depth`` is 0 for a top-level stage and grows by one for each stage
    nested inside another on the same thread; ``parent`` names the enclosing
    stage.  ``seq`` is unique within the process and shared by a stage's
    begin and end events.  ``model_paths`` lists the worker attribute paths
    that were tried when the model was looked up on a worker.  ``replay`` is
    True for a replay: the stage's body run again right after it ended, with
    the same inputs, for the capture observers armed by an anomaly it raised
    (:mod:`verl_events.capture.replay`); only armed capture observers and observers
    that set ``sees_replays`` receive it.
    """

    stage: str
    role: str | None
    step: int | None
    rank: int
    world_size: int
    model: Any = None
    meta: Mapping[str, Any] = field(default_factory=lambda: EMPTY_META)
    depth: int = 0
    parent: str | None = None
    seq: int = 0
    model_paths: tuple[str, ...] = ()
    replay: bool = False

    def ended(
        self,
        elapsed_s: float,
        error: BaseException | None,
        result: Any = None,
        inputs: Any = None,
    ) -> StageEnd:
        """The matching end event (``result`` and ``inputs`` by reference)."""
        return StageEnd(
            self.stage,
            self.role,
            self.step,
            self.rank,
            self.world_size,
            self.model,
            self.meta,
            self.depth,
            self.parent,
            self.seq,
            self.model_paths,
            self.replay,
            elapsed_s,
            error,
            result,
            inputs,
        )


@dataclass(frozen=True, slots=True)
class StageEnd(StageEvent):
    """A stage has finished.

    ``elapsed_s`` is the wall time of the stage body alone (observer hooks
    excluded).  ``error`` is the exception the body raised, or None; the bus
    re-raises it unchanged after the end hooks ran.

    ``result`` (the stage's return value) and ``inputs`` (its first data
    argument) are set only when an observer that received this stage's
    begin sets ``wants_result``; every receiver of this end event then sees
    them, and otherwise both are None.  They are the stage's own objects,
    not copies: read them, do not change them.  ``result`` is None when
    ``error`` is set.  Neither takes part in ``repr`` or ``==`` (they may be
    tensors).
    """

    elapsed_s: float = 0.0
    error: BaseException | None = None
    result: Any = field(default=None, repr=False, compare=False)
    inputs: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class StageReport:
    """What the bus measured around one stage, for timing-capable observers.

    ``observers`` names the observers that received this stage, in begin
    order; ``begin_seconds`` and ``end_seconds`` map each of them to the
    time spent in its begin and end hook, ``hook_seconds`` to their sum.
    Hooks run one after another, begins in ``observers`` order and ends in
    reverse, so the stage's timeline can be rebuilt from these.
    ``enclosing`` names the non-passive observers that held an enclosing
    stage open on this thread (verl's ``train_batch`` runs inside
    ``actor_update``): a capture around the stage slows it although it did
    not receive it.  ``passive`` names the observers in ``observers`` that
    only watch, so their presence does not make the stage profiled.
    """

    event: StageEnd
    observers: tuple[str, ...]
    hook_seconds: Mapping[str, float] = field(default_factory=dict)
    begin_seconds: Mapping[str, float] = field(default_factory=dict)
    end_seconds: Mapping[str, float] = field(default_factory=dict)
    enclosing: tuple[str, ...] = ()
    passive: frozenset[str] = frozenset()
