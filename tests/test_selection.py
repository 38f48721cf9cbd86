from __future__ import annotations

import pytest

from verl_events import ConfigError, Selection, VerlEventsWarning
from verl_events.config import parse_numbers

from .support import make_event


def test_ranges_and_ints_compile_to_one_set() -> None:
    assert parse_numbers([1, "4-6", "9"], "steps") == {1, 4, 5, 6, 9}


def test_a_single_item_is_accepted_in_place_of_a_list() -> None:
    assert parse_numbers(3, "steps") == {3}
    assert parse_numbers("2-3", "ranks") == {2, 3}


def test_null_means_all() -> None:
    assert parse_numbers(None, "steps") is None
    assert Selection.parse().accepts(make_event(step=None, rank=99))


@pytest.mark.parametrize("bad", ["5-2", -1, "x", 1.5, True, "1-", [1, [2]]])
def test_bad_step_values_name_the_key_and_the_value(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"observers\[0\]\.steps: .* is not allowed; use non-negative integers"):
        Selection.parse(steps=bad, where="observers[0]")


def test_selection_filters_each_field() -> None:
    sel = Selection.parse(steps=["1-2"], stages=["actor_update"], roles=["actor"], ranks=[0])
    assert sel.accepts(make_event(step=2))
    assert not sel.accepts(make_event(step=3))
    assert not sel.accepts(make_event(stage="critic_update"))
    assert not sel.accepts(make_event(role="ref"))
    assert not sel.accepts(make_event(rank=1))


def test_unknown_step_is_outside_an_explicit_step_list() -> None:
    assert not Selection.parse(steps=[1]).accepts(make_event(step=None))


def test_unknown_stage_warns_listing_the_known_ones() -> None:
    with pytest.warns(VerlEventsWarning, match=r"'actor_updat' is not a stage verl runs; known stages: .*actor_update"):
        sel = Selection.parse(stages=["actor_updat"])
    assert sel.stages == {"actor_updat"}


def test_unknown_stage_is_an_error_in_strict_mode() -> None:
    with pytest.raises(ConfigError, match="strict mode does not allow them"):
        Selection.parse(stages=["actor_updat"], strict=True)


@pytest.mark.parametrize("bad", ["../escape", "a/b", ".."])
def test_stage_names_with_path_parts_are_rejected(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"stages: .* is not a valid stage name"):
        Selection.parse(stages=[bad])


def test_roles_must_be_names() -> None:
    with pytest.raises(ConfigError, match=r"roles: 3 is not allowed"):
        Selection.parse(roles=[3])
