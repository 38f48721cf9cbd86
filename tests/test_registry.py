from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

import pytest

import verl_events
from verl_events import ConfigError, ObserverSetupError, install
from verl_events.testing import RecordingObserver

if TYPE_CHECKING:
    from decimal import Decimal  # only for the type checker: get_type_hints cannot resolve it


def add_distribution(root: Path, dist: str, entry_points: str, modules: dict[str, str]) -> None:
    """A real installed distribution on sys.path: dist-info with entry points, plus modules."""
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[verl_events.observers]\n" + textwrap.dedent(entry_points))
    for name, source in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source))


def test_builtin_entry_points_resolve_by_name() -> None:
    assert "recording" in verl_events.config.available_observers()
    with install({"observers": [{"name": "recording", "stages": ["actor_update"], "priority": 5}]}) as inst:
        [observer] = inst.observers
    assert isinstance(observer, RecordingObserver)
    assert (observer.name, observer.priority) == ("recording", 5)
    assert observer.selection.stages == {"actor_update"}
    assert observer.closed


def test_target_resolves_an_import_path_in_both_spellings() -> None:
    for target in ("verl_events.testing:RecordingObserver", "verl_events.testing.RecordingObserver"):
        with install({"observers": [{"_target_": target, "timings": True}]}) as inst:
            [observer] = inst.observers
        assert isinstance(observer, RecordingObserver) and observer.wants_timings


def test_unknown_name_lists_the_available_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"observers\[0\]\.name: 'nsys2' is not an installed observer; available: .*recording"
    ):
        install({"observers": [{"name": "nsys2"}]})


@pytest.mark.parametrize(
    ("target", "pattern"),
    [
        (
            "no_such_module_xyz:Thing",
            r"no module 'no_such_module_xyz' on Python's path, so 'no_such_module_xyz:Thing' does not",
        ),
        ("verl_events.testing:Nope", r"'verl_events.testing' has no attribute 'Nope'"),
        ("Justaname", r"'Justaname' is not an import path"),
        (
            "verl_events.testing:capture_events",
            r"is <function capture_events.*>, not a subclass of verl_events.Observer",
        ),
    ],
)
def test_bad_targets_are_clear_errors(target: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        install({"observers": [{"_target_": target}]})


def test_an_entry_point_that_fails_to_import_names_distribution_and_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_distribution(
        tmp_path,
        "broken_obs",
        "broken = broken_obs_mod:Broken\n",
        {"broken_obs_mod": "raise ImportError('needs libfoo')\n"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError,
        match=r"entry point 'broken' \(broken_obs_mod:Broken\) of distribution 'broken_obs' failed to import: "
        r"ImportError: needs libfoo",
    ):
        install({"observers": [{"name": "broken"}]})


def test_a_third_party_entry_point_is_a_first_class_observer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    add_distribution(
        tmp_path,
        "counter_obs",
        "counter = counter_obs_mod:Counter\n",
        {
            "counter_obs_mod": """
            from verl_events import Observer

            class Counter(Observer):
                def __init__(self, start=0):
                    self.count = start

                def on_stage_end(self, event):
                    self.count += 1
            """
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with install({"observers": [{"name": "counter", "start": 10}]}) as inst:
        with verl_events.stage("actor_update", step=1):
            pass
        assert inst.observers[0].count == 11  # type: ignore[attr-defined]


def test_unknown_observer_options_list_the_allowed_ones() -> None:
    with pytest.raises(
        ConfigError,
        match=r"observers\[0\] \(recording\): unknown option 'timing'; RecordingObserver takes timings, fail_on, "
        r"and every observer takes name, steps, stages, roles, ranks, priority, enabled",
    ):
        install({"observers": [{"name": "recording", "timing": True}]})


class ExplodingInit(verl_events.Observer):
    def __init__(self) -> None:
        raise OSError("device busy")


class BadOption(verl_events.Observer):
    def __init__(self, level: str = "L1") -> None:
        if level not in ("L0", "L1"):
            raise ConfigError(f"level: {level!r} is not allowed; use L0 or L1")


@pytest.mark.parametrize("strict", [False, True])
def test_an_observer_whose_init_raises_is_named_at_install(strict: bool) -> None:
    with pytest.raises(
        ObserverSetupError,
        match=r"observers\[0\] \(tests.test_registry:ExplodingInit\) could not be created: OSError: device busy",
    ):
        install({"strict": strict, "observers": [{"_target_": "tests.test_registry:ExplodingInit"}]})
    assert verl_events.current_installation() is None


def test_a_config_error_from_an_observer_keeps_its_type_and_gains_its_location() -> None:
    with pytest.raises(
        ConfigError, match=r"observers\[0\] \(tests.test_registry:BadOption\): level: 'L9' is not allowed"
    ):
        install({"observers": [{"_target_": "tests.test_registry:BadOption", "level": "L9"}]})


class Options(verl_events.Observer):
    """A third-party observer with one option of each annotation kind the registry checks."""

    def __init__(
        self,
        flag: bool = False,
        count: int = 1,
        ratio: float = 0.5,
        label: str = "x",
        names: list[str] | None = None,
        level: Literal["L0", "L1", "L2"] = "L1",
        limit: Optional[int] = None,  # noqa: UP045  (the old spelling is what this test checks)
        pair: tuple[str, ...] = (),
        anything: Any = None,
        untyped=None,  # type: ignore[no-untyped-def]
    ) -> None:
        self.given = dict(
            flag=flag,
            count=count,
            ratio=ratio,
            label=label,
            names=names,
            level=level,
            limit=limit,
            pair=pair,
            anything=anything,
            untyped=untyped,
        )


class ForwardOnly(verl_events.Observer):
    def __init__(self, amount: Decimal | None = None, flag: bool = False) -> None:
        self.amount, self.flag = amount, flag


def build_options(**options: Any) -> Options:
    with install({"observers": [{"_target_": "tests.test_registry:Options", **options}]}) as inst:
        [observer] = inst.observers
    assert isinstance(observer, Options)
    return observer


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"flag": "no"}, r"option flag: 'no' is not allowed; use true or false$"),
        ({"flag": 0}, r"option flag: 0 is not allowed; use true or false$"),
        ({"count": True}, r"option count: True is not allowed; use an integer$"),
        ({"count": 2.5}, r"option count: 2.5 is not allowed; use an integer$"),
        ({"count": "3"}, r"option count: '3' is not allowed; use an integer$"),
        ({"ratio": False}, r"option ratio: False is not allowed; use a number$"),
        ({"ratio": "0.1"}, r"option ratio: '0.1' is not allowed; use a number$"),
        ({"label": 7}, r"option label: 7 is not allowed; use a string$"),
        ({"names": "actor"}, r"option names: 'actor' is not allowed; use a list of strings or null$"),
        ({"names": ["actor", 3]}, r"option names\[1\]: 3 is not allowed; use a string$"),
        ({"level": "L9"}, r"option level: 'L9' is not allowed; use one of 'L0', 'L1', 'L2'$"),
        ({"limit": "many"}, r"option limit: 'many' is not allowed; use an integer or null$"),
        ({"pair": "ab"}, r"option pair: 'ab' is not allowed; use a list of strings$"),
        ({"pair": ["a", None]}, r"option pair\[1\]: None is not allowed; use a string$"),
    ],
)
def test_a_target_observers_options_are_checked_against_its_annotations(options: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=r"^observers\[0\] \(tests.test_registry:Options\): " + pattern):
        build_options(**options)
    assert verl_events.current_installation() is None


def test_options_that_fit_their_annotations_reach_the_constructor_unchanged() -> None:
    options = dict(flag=True, count=3, ratio=2, label="y", names=["a", "b"], level="L0", limit=None, pair=["p", "q"])
    assert build_options(**options).given == {**options, "anything": None, "untyped": None}


def test_unannotated_and_any_options_are_not_checked() -> None:
    given = build_options(anything={"free": "form"}, untyped="no").given
    assert (given["anything"], given["untyped"]) == ({"free": "form"}, "no")


def test_an_option_whose_annotation_cannot_be_resolved_is_not_checked_and_the_others_are() -> None:
    target = "tests.test_registry:ForwardOnly"
    with pytest.raises(ConfigError, match=r"option flag: 'no' is not allowed; use true or false$"):
        install({"observers": [{"_target_": target, "amount": "1.5", "flag": "no"}]})
    with install({"observers": [{"_target_": target, "amount": "1.5", "flag": True}]}) as inst:
        [observer] = inst.observers
    assert observer.amount == "1.5"  # type: ignore[attr-defined]


def test_a_builtin_observers_options_are_checked_the_same_way(tmp_path: Path) -> None:
    config = {"save_path": str(tmp_path), "observers": [{"name": "recording"}, {"name": "timing", "console": "no"}]}
    with pytest.raises(
        ConfigError, match=r"^observers\[1\] \(timing\): option console: 'no' is not allowed; use true or false$"
    ):
        install(config)
    assert verl_events.current_installation() is None


def test_a_third_party_entry_points_options_are_checked_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_distribution(
        tmp_path,
        "typed_obs",
        "typed = typed_obs_mod:Typed\n",
        {
            "typed_obs_mod": """
            from __future__ import annotations
            from typing import Literal
            from verl_events import Observer

            class Typed(Observer):
                def __init__(self, mode: Literal["fast", "full"] = "fast", every: int = 1) -> None:
                    self.mode, self.every = mode, every
            """
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"^observers\[0\] \(typed\): option mode: 'slow' is not allowed; use one of 'fast', 'full'$"
    ):
        install({"observers": [{"name": "typed", "mode": "slow"}]})
    with install({"observers": [{"name": "typed", "mode": "full", "every": 2}]}) as inst:
        assert (inst.observers[0].mode, inst.observers[0].every) == ("full", 2)  # type: ignore[attr-defined]


def test_unknown_options_are_refused_before_any_value_is_checked() -> None:
    with pytest.raises(
        ConfigError, match=r"\(tests.test_registry:Options\): unknown option 'levle'; Options takes flag, count"
    ):
        build_options(levle="L9", flag="no")
