from __future__ import annotations

import dataclasses

import pytest

from verl_events import ConfigError, StageEnd, StageEvent
from verl_events._events import check_stage_name

from .support import make_event


def test_stage_event_is_frozen() -> None:
    event = make_event()
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.step = 2  # type: ignore[misc]


def test_meta_defaults_to_an_empty_read_only_mapping() -> None:
    event = make_event()
    assert dict(event.meta) == {}
    with pytest.raises(TypeError):
        event.meta["x"] = 1  # type: ignore[index]


def test_ended_copies_every_field_and_adds_time_and_error() -> None:
    error = ValueError("boom")
    begin = make_event(step=7, rank=3, world_size=4, depth=1, parent="outer", seq=42)
    end = begin.ended(1.5, error)
    assert isinstance(end, StageEnd)
    assert (end.stage, end.step, end.rank, end.world_size, end.depth, end.parent, end.seq) == (
        "actor_update", 7, 3, 4, 1, "outer", 42,
    )
    assert end.elapsed_s == 1.5 and end.error is error


@pytest.mark.parametrize("name", ["actor_update", "my.stage-2", "A_b"])
def test_valid_stage_names_pass(name: str) -> None:
    assert check_stage_name(name) == name


@pytest.mark.parametrize("name", ["a/b", "..", ".", "", "has space", "x+y", None, 3])
def test_stage_names_that_cannot_be_directories_are_rejected(name: object) -> None:
    with pytest.raises(ConfigError, match="not a valid stage name"):
        check_stage_name(name)
