from __future__ import annotations

import dataclasses

import pytest

from verl_events import ConfigError, StageEnd
from verl_events.events.stages import check_stage_name

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
        "actor_update",
        7,
        3,
        4,
        1,
        "outer",
        42,
    )
    assert end.elapsed_s == 1.5 and end.error is error


@pytest.mark.parametrize("name", ["actor_update", "my.stage-2", "A_b"])
def test_valid_stage_names_pass(name: str) -> None:
    assert check_stage_name(name) == name


@pytest.mark.parametrize("name", ["a/b", "..", ".", "", "has space", "x+y", None, 3])
def test_stage_names_that_cannot_be_directories_are_rejected(name: object) -> None:
    with pytest.raises(ConfigError, match="not a valid stage name"):
        check_stage_name(name)


def test_ended_carries_result_and_inputs_by_reference_and_none_by_default() -> None:
    result, inputs = {"loss": 1.0}, ["batch"]
    end = make_event().ended(0.1, None, result, inputs)
    assert end.result is result and end.inputs is inputs
    plain = make_event().ended(0.1, None)
    assert (plain.result, plain.inputs) == (None, None)


def test_result_and_inputs_stay_out_of_repr_and_equality() -> None:
    class NoBool:
        """Like a tensor: == gives something that refuses bool()."""

        def __eq__(self, other: object) -> bool:
            raise AssertionError("compared")

        def __repr__(self) -> str:
            raise AssertionError("printed")

    begin = make_event(seq=3)
    end = begin.ended(0.1, None, NoBool(), NoBool())
    assert end == begin.ended(0.1, None)
    assert "result" not in repr(end)
