"""What the dispatcher says once: a stage whose step is unknown, a model not resolved, an
observer whose ranks the run does not have."""

from __future__ import annotations

import logging

from verl_events.events.observer import Observer
from verl_events.events.stages import StageEvent

logger = logging.getLogger("verl_events")


def warn_step_unknown(event: StageEvent, candidates: tuple[Observer, ...], warned: set[str]) -> None:
    """Once per stage: observers that select steps never see a stage whose step is unknown."""
    skipping = [o.name for o in candidates if o.selection.steps is not None]
    if not skipping:
        return
    warned.add(event.stage)
    observers = ", ".join(repr(name) for name in skipping)
    which = (
        f"observer {observers}, which selects steps, skips"
        if len(skipping) == 1
        else (f"observers {observers}, which select steps, skip")
    )
    logger.warning(
        "stage %r (rank %s) runs with an unknown step, so %s it. "
        "Pass step=..., call verl_events.set_step(N), or under verl see docs/verl.md, "
        "'Which step a stage belongs to' (a process without the actor learns the step only on "
        "verl's own global_profiler.steps).",
        event.stage,
        event.rank,
        which,
    )


def warn_model_missing(event: StageEvent, selected: list[Observer], warned: set[tuple[str, str | None]]) -> None:
    """Once per stage and role: an observer that needs the model got none; which paths were tried."""
    key = (event.stage, event.role)
    if key in warned:
        return
    warned.add(key)
    needing = ", ".join(repr(o.name) for o in selected if o.needs_model)
    tried = (
        "tried worker attributes " + ", ".join(event.model_paths)
        if event.model_paths
        else "no model= was passed to stage()"
    )
    logger.warning(
        "model not resolved for stage %r (role %r, step %s): observer %s needs one; %s. "
        "Pass model=..., or add a path with verl_events.add_model_paths(%r, 'attr.path').",
        event.stage,
        event.role,
        event.step,
        needing,
        tried,
        event.role or "<role>",
    )


def warn_ranks_outside(event: StageEvent, observers: tuple[Observer, ...], warned: set[str]) -> None:
    """Once per observer: one that selects only ranks past this run's world size never runs
    (a config written for more ranks than the job has).  A trainer rank's event says the world
    size; the driver's (rank -1) does not, and is passed over."""
    if event.rank < 0 or event.world_size < 1:
        return
    for observer in observers:
        ranks = observer.selection.ranks
        if ranks is None or observer.name in warned or any(rank < event.world_size for rank in ranks):
            continue
        warned.add(observer.name)
        logger.warning(
            "observer %r selects rank(s) %s, and this run has %d rank(s) (world size %d): it never runs. "
            "Select ranks below %d, or run with more ranks.",
            observer.name,
            ", ".join(map(str, sorted(ranks))),
            event.world_size,
            event.world_size,
            event.world_size,
        )
