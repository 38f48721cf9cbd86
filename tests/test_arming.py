"""Armed capture: ``trigger: anomaly`` observers capture the steps after an anomaly."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import verl_events
from verl_events import AnomalyEvent, ConfigError, anomaly

from .support import Capturing, run_steps, run_two_gloo_ranks


def armed_entry(**keys: object) -> dict[str, object]:
    return {"_target_": "tests.support:Capturing", "trigger": "anomaly", **keys}


def watcher_entry(bad_steps: list[int]) -> dict[str, object]:
    return {"_target_": "tests.support:Watcher", "bad_steps": bad_steps}


def captured_steps(installation: verl_events.setup.install.Installation) -> list[int | None]:
    (armed,) = [o for o in installation.observers if isinstance(o, Capturing)]
    return sorted({step for hook, _, step in armed.calls if hook == "begin"})  # type: ignore[type-var]


def test_the_step_after_an_anomaly_is_captured_and_no_other(tmp_path: Path) -> None:
    config = {"save_path": str(tmp_path), "observers": [watcher_entry([3]), armed_entry()]}
    with verl_events.install(config) as installation:
        run_steps(range(1, 7))
    assert captured_steps(installation) == [4]


def test_capture_steps_and_fixed_steps_add_up(tmp_path: Path) -> None:
    config = {"save_path": str(tmp_path), "observers": [watcher_entry([2]), armed_entry(steps=[1], capture_steps=2)]}
    with verl_events.install(config) as installation:
        run_steps(range(1, 7))
    assert captured_steps(installation) == [1, 3, 4]


def test_max_captures_bounds_the_captures_and_says_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = {"save_path": str(tmp_path), "observers": [watcher_entry([1, 3, 5]), armed_entry(max_captures=2)]}
    with caplog.at_level(logging.INFO, logger="verl_events"), verl_events.install(config) as installation:
        run_steps(range(1, 8))
    assert captured_steps(installation) == [2, 4]
    reached = [r.getMessage() for r in caplog.records if "max_captures" in r.getMessage()]
    assert len(reached) == 1 and "step 5" in reached[0]


def test_an_anomaly_seen_in_the_middle_of_a_step_arms_the_next_step_from_its_first_stage(tmp_path: Path) -> None:
    """The watcher fires at the first stage's end; the rest of that step is not captured."""
    config = {"save_path": str(tmp_path), "observers": [watcher_entry([2]), armed_entry()]}
    with verl_events.install(config) as installation:
        run_steps(range(1, 4), stages=("rollout_generate", "actor_update", "critic_update"))
    (armed,) = [o for o in installation.observers if isinstance(o, Capturing)]
    assert [(s, step) for hook, s, step in armed.calls if hook == "begin"] == [
        ("rollout_generate", 3),
        ("actor_update", 3),
        ("critic_update", 3),
    ]


def test_an_anomaly_at_an_unknown_step_arms_nothing_and_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = {"save_path": str(tmp_path), "observers": [watcher_entry([]), armed_entry()]}
    with verl_events.install(config) as installation:
        anomaly.send("actor_update", event=AnomalyEvent(None, "actor_update", 0, "loss", 1e9, "above", 10.0))
        anomaly.send("actor_update", event=AnomalyEvent(None, "actor_update", 0, "loss", 1e9, "above", 10.0))
        run_steps(range(1, 3))
    assert captured_steps(installation) == []
    assert len([r for r in caplog.records if "unknown step" in r.getMessage()]) == 1


def test_closing_stops_listening_to_anomalies(tmp_path: Path) -> None:
    config = {"save_path": str(tmp_path), "observers": [watcher_entry([]), armed_entry()]}
    before = len(anomaly.receivers)
    with verl_events.install(config):
        # One receiver, the dispatcher, hands anomalies to the trigger clock and the replay plan.
        assert len(anomaly.receivers) == before + 1
    assert len(anomaly.receivers) == before
    with verl_events.install({**config, "replay": False}):
        assert len(anomaly.receivers) == before + 1
    assert len(anomaly.receivers) == before
    with verl_events.install({**config, "observers": [watcher_entry([])]}):
        assert len(anomaly.receivers) == before  # nothing armed, no on_anomaly hook: nothing listens


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"trigger": "nan"}, r"observers\[0\].trigger: 'nan' is not allowed; use anomaly"),
        ({"trigger": "anomaly", "capture_steps": 0}, r"capture_steps: 0 is not allowed; use an integer >= 1"),
        ({"trigger": "anomaly", "capture_steps": True}, r"capture_steps: True is not allowed"),
        (
            {"trigger": "anomaly", "max_captures": "3"},
            r"max_captures: '3' is not allowed; use an integer >= 1, or null",
        ),
        ({"capture_steps": 2}, r"capture_steps: only applies with trigger: anomaly"),
    ],
)
def test_bad_trigger_keys_are_named(keys: dict[str, object], message: str) -> None:
    entry = {"_target_": "tests.support:Capturing", **keys}
    with pytest.raises(ConfigError, match=message):
        verl_events.config.load_config({"observers": [entry]})


def test_an_armed_observer_without_anything_sending_anomalies_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"observer 'tests.support:Capturing' has trigger: anomaly, but no "
        r"installed observer sends anomalies.*- name: sentinel",
    ):
        verl_events.install({"save_path": str(tmp_path), "observers": [armed_entry()]})
    assert verl_events.current_installation() is None


def test_only_capture_observers_can_be_armed(tmp_path: Path) -> None:
    entry = {"name": "recording", "trigger": "anomaly"}
    with pytest.raises(ConfigError, match=r"trigger: anomaly arms capture observers .*'recording' does not capture"):
        verl_events.install({"save_path": str(tmp_path), "observers": [watcher_entry([]), entry]})


def test_armed_observers_still_meet_the_exclusive_resource_check(tmp_path: Path) -> None:
    """An armed msprobe may dump on any step, so it overlaps a step-selected one."""
    pytest.importorskip("msprobe")
    config_path = tmp_path / "dump.json"
    config_path.write_text(json.dumps({"task": "statistics", "level": "L1"}))
    observers = [
        watcher_entry([]),
        {"name": "msprobe", "config_path": str(config_path), "trigger": "anomaly", "warm_up": False},
        {"name": "msprobe", "config_path": str(config_path), "steps": [1], "warm_up": False},
    ]
    with pytest.raises(ConfigError, match="both need 'msprobe'"):
        verl_events.install({"save_path": str(tmp_path), "observers": observers})


@pytest.mark.slow
def test_an_anomaly_on_one_rank_arms_every_rank_for_the_same_step(tmp_path: Path) -> None:
    """Two gloo ranks; only rank 1 sees the anomaly at step 2; both capture step 3."""
    pytest.importorskip("torch")
    result = run_two_gloo_ranks(
        tmp_path,
        f"""
            import verl_events
            from tests.support import run_steps
            config = {{"save_path": {str(tmp_path)!r}, "observers": [
                {{"_target_": "tests.support:Watcher", "bad_steps": [2] if rank == 1 else []}},
                {{"_target_": "tests.support:Capturing", "trigger": "anomaly"}},
            ]}}
            with verl_events.install(config) as installation:
                run_steps(range(1, 6))
            armed = [o for o in installation.observers if o.captures][0]
            steps = sorted({{step for hook, _, step in armed.calls if hook == "begin"}})
            with open(os.path.join({str(tmp_path)!r}, f"rank{{rank}}.json"), "w") as f:
                json.dump(steps, f)
            dist.destroy_process_group()
        """,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "rank0.json").read_text()) == [3]
    assert json.loads((tmp_path / "rank1.json").read_text()) == [3]


def test_a_fault_that_persists_still_arms_the_step_right_after_it(tmp_path: Path) -> None:
    """A NaN at step 2 shows again in step 3's first stages, before the armed observer's
    first stage: step 3 is still the one captured, not step 4."""
    config = {
        "save_path": str(tmp_path),
        "observers": [watcher_entry([2, 3, 4, 5]), armed_entry(stages=["actor_update"], max_captures=1)],
    }
    with verl_events.install(config) as installation:
        run_steps(range(1, 6), stages=("actor_compute_log_prob", "actor_update"))
    assert captured_steps(installation) == [3]
