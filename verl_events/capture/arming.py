"""Armed capture: observers that capture the steps after an anomaly.

A capture observer configured with ``trigger: anomaly`` selects, besides
any ``steps`` it lists, the ``capture_steps`` steps that follow each
anomaly (the ``anomaly`` signal, sent by the sentinel), at most
``max_captures`` times per run so the disk stays bounded.

Every rank captures the same steps.  An anomaly is often seen on one rank
only (one rank's shard of the gradient goes NaN), yet the dump is only
useful next to the other ranks'.  So the trigger is agreed at each step
boundary, as a named step of the dispatcher (``Dispatcher.on_begin`` calls
:meth:`TriggerClock.advance` before it looks at any selection): the first
stage of a new step the installation receives on each rank runs one
all-reduce (max) of the newest anomaly step this rank has seen, when
torch.distributed is initialised with more than one rank.  That costs one
tiny collective per step and requires every rank to run at least one stage
the installation listens to in every step, which verl's SPMD workers do.
Selections only read the agreed value; they never run a collective.
Without a process group (plain processes, or Ray actors that never
initialise one) each process arms itself from its own anomalies only.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_events.events.anomaly import AnomalyEvent
from verl_events.events.errors import ConfigError, check_count
from verl_events.events.observer import Observer
from verl_events.events.selection import Selection
from verl_events.events.stages import StageEvent

logger = logging.getLogger("verl_events")

TRIGGERS = ("anomaly",)
TRIGGER_KEYS = ("trigger", "capture_steps", "max_captures")
DEFAULT_CAPTURE_STEPS = 1
DEFAULT_MAX_CAPTURES = 3


@dataclass(frozen=True, slots=True)
class Trigger:
    """When an armed observer captures: ``capture_steps`` steps after each
    anomaly, at most ``max_captures`` times (None: no limit)."""

    capture_steps: int = DEFAULT_CAPTURE_STEPS
    max_captures: int | None = DEFAULT_MAX_CAPTURES


def parse_trigger(entry: Any, where: str) -> Trigger | None:
    """The ``trigger`` keys of one ``observers:`` entry, checked; None when it has no trigger."""
    trigger = entry.get("trigger")
    if trigger is None:
        stray = [key for key in TRIGGER_KEYS[1:] if key in entry]
        if stray:
            raise ConfigError(
                f"{where}.{stray[0]}: only applies with trigger: anomaly; add trigger: anomaly, or remove {stray[0]}"
            )
        return None
    if trigger not in TRIGGERS:
        raise ConfigError(f"{where}.trigger: {trigger!r} is not allowed; use {', '.join(TRIGGERS)}")
    capture_steps = check_count(
        entry.get("capture_steps", DEFAULT_CAPTURE_STEPS),
        f"{where}.capture_steps",
        why="how many steps to capture after each anomaly",
    )
    max_captures = check_count(
        entry.get("max_captures", DEFAULT_MAX_CAPTURES), f"{where}.max_captures", null="for no limit"
    )
    return Trigger(capture_steps=capture_steps, max_captures=max_captures)


class TriggerClock:
    """The newest anomaly step every rank agrees on, refreshed once per step.

    One per installation.  The dispatcher hands it every ``anomaly``
    (:meth:`on_anomaly`, before any observer's hook) and it remembers the
    newest anomaly step this process saw; :meth:`advance`, which the
    dispatcher calls at every stage's begin, runs the all-reduce when it
    first sees a new step, and :meth:`newest` reads what was agreed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[int] = set()  # anomaly steps this process saw, not yet agreed on
        self._agreed = -1  # newest anomaly step all ranks agreed on
        self._step: int | None = None  # the step of the last agreement
        self._warned_unknown = False

    def on_anomaly(self, event: AnomalyEvent) -> None:
        """Remember the anomaly's step for the next agreement."""
        if event.step is None:
            if not self._warned_unknown:
                self._warned_unknown = True
                logger.warning(
                    "anomaly in stage %r (metric %r) at an unknown step: armed observers cannot tell which "
                    "step comes next, so nothing is captured for it "
                    "(see docs/verl.md, 'Which step a stage belongs to')",
                    event.stage,
                    event.metric,
                )
            return
        with self._lock:
            self._seen.add(event.step)

    def advance(self, step: int) -> None:
        """The step boundary: at the first stage of a new ``step``, agree with
        every rank on the newest anomaly step before it (a collective, when
        there are several ranks).  Later calls for the same step do nothing.

        Only earlier steps count: a fault that persists shows again in this
        step's first stages, and arming from it would skip this step.
        """
        with self._lock:
            if step != self._step:
                self._step = step
                earlier = {seen for seen in self._seen if seen < step}
                self._seen -= earlier  # agreed on now: only the newest matters from here on
                self._agreed = max(self._agreed, max_over_ranks(max(earlier, default=-1)))

    def newest(self) -> int | None:
        """The newest anomaly step all ranks agreed on so far, or None."""
        agreed = self._agreed
        return agreed if agreed >= 0 else None


def max_over_ranks(value: int) -> int:
    """``value`` all-reduced with max over the default process group, or
    ``value`` itself when there is none (or one rank)."""
    dist = sys.modules.get("torch.distributed")  # never import torch for this
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return value
    import torch

    backend = str(dist.get_backend())
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    elif backend == "hccl":
        device = torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]
    else:
        device = torch.device("cpu")
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


@dataclass(slots=True, eq=False)
class Arming:
    """One armed observer's state: the steps it was armed for and how often."""

    observer: str
    trigger: Trigger
    clock: TriggerClock | None = None  # set at install
    armed: set[int] = field(default_factory=set)
    captures: int = 0
    handled: int = -1  # the newest anomaly step acted on
    said_full: bool = False  # max_captures reached, and logged
    lock: threading.Lock = field(default_factory=threading.Lock)

    def armed_for(self, step: int) -> bool:
        """Whether ``step`` is armed, arming it first from the clock's newest
        agreed anomaly (no collective runs here: see :meth:`TriggerClock.advance`)."""
        if self.clock is None:
            return False
        newest = self.clock.newest()
        with self.lock:
            if newest is not None and newest > self.handled:
                self.handled = newest
                self._arm_after(newest, step)
            return step in self.armed

    def has_room(self) -> bool:
        """Whether this observer may capture another anomaly (``max_captures``)."""
        limit = self.trigger.max_captures
        with self.lock:
            return limit is None or self.captures < limit

    def _arm_after(self, anomaly_step: int, step: int) -> None:
        limit = self.trigger.max_captures
        if limit is not None and self.captures >= limit:
            if not self.said_full:
                self.said_full = True
                logger.warning(
                    "observer %r reached max_captures (%d): the anomaly at step %d and later ones are not "
                    "captured; raise max_captures, or set it to null, to capture more",
                    self.observer,
                    limit,
                    anomaly_step,
                )
            return
        self.captures += 1
        # The step after the anomaly, or this one if the news came late.
        first = max(anomaly_step + 1, step)
        steps = range(first, first + self.trigger.capture_steps)
        self.armed.update(steps)
        logger.info(
            "anomaly at step %d: observer %r captures step%s %s (capture %d of %s)",
            anomaly_step,
            self.observer,
            "" if len(steps) == 1 else "s",
            ", ".join(map(str, steps)),
            self.captures,
            limit if limit is not None else "no limit",
        )


@dataclass(frozen=True, slots=True)
class ArmedSelection(Selection):
    """A selection whose steps are ``fixed_steps`` plus the armed ones.

    ``steps`` stays None: for the exclusive-resource check an armed
    observer may hold its tool on any step.
    """

    fixed_steps: frozenset[int] = frozenset()
    arming: Arming | None = None

    @classmethod
    def wrap(cls, selection: Selection, trigger: Trigger, observer: str) -> ArmedSelection:
        return cls(
            steps=None,
            stages=selection.stages,
            roles=selection.roles,
            ranks=selection.ranks,
            fixed_steps=selection.steps or frozenset(),
            arming=Arming(observer, trigger),
        )

    def accepts(self, event: StageEvent) -> bool:
        step = event.step
        if step is None or self.arming is None:
            return False
        if event.replay:  # run because an anomaly was just sent (verl_events.capture.replay)
            return self.arming.has_room() and Selection.accepts(self, event)
        armed = self.arming.armed_for(step)
        return (armed or step in self.fixed_steps) and Selection.accepts(self, event)


def check_triggers(observers: Sequence[Observer]) -> list[Arming]:
    """The armed observers' states; ConfigError when an observer is armed but
    nothing among ``observers`` sends anomalies."""
    armed = [o.selection.arming for o in observers if isinstance(o.selection, ArmedSelection) and o.selection.arming]
    if armed and not any(o.sends_anomalies for o in observers):
        names = ", ".join(repr(arming.observer) for arming in armed)
        raise ConfigError(
            f"observer {names} has trigger: anomaly, but no installed observer sends anomalies, so it would "
            "never capture; add the sentinel observer (- name: sentinel) to observers:, or remove trigger"
        )
    return armed


def armed_stages(observers: Sequence[Observer]) -> frozenset[str] | None:
    """The stages some armed observer selects (None: any stage)."""
    stages: set[str] = set()
    for observer in observers:
        if isinstance(observer.selection, ArmedSelection):
            if observer.selection.stages is None:
                return None
            stages |= observer.selection.stages
    return frozenset(stages)


def arm(observers: Sequence[Observer]) -> TriggerClock | None:
    """Give the installation's armed observers one shared clock; None when none is armed.

    ConfigError when an observer is armed but nothing installed sends anomalies.
    """
    armed = check_triggers(observers)
    if not armed:
        return None
    clock = TriggerClock()
    for arming in armed:
        arming.clock = clock
    return clock
