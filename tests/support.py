"""Helpers several test modules share (test modules import from here, never from each other)."""

from __future__ import annotations

from verl_events import StageEvent


def make_event(**overrides: object) -> StageEvent:
    fields = dict(stage="actor_update", role="actor", step=1, rank=0, world_size=1)
    fields.update(overrides)
    return StageEvent(**fields)  # type: ignore[arg-type]
