"""Presets: ``preset: always_on`` (or the name alone) expands to the cheap watchers."""

from __future__ import annotations

import json
import math
import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import yaml

import verl_events
from verl_events import ConfigError, stage
from verl_events.config import build_observers, load_config
from verl_events.observers.mismatch.record import MismatchRecord, mismatch_log_path
from verl_events.observers.sentinel.record import anomaly_log_path
from verl_events.observers.timing import TimingRecord, timing_log_path
from verl_events.observers.watchdog.record import heartbeat_files, read_heartbeat

ALWAYS_ON = ["timing", "watchdog", "sentinel", "mismatch", "memory"]
UNKNOWN_PRESET = r"is not a preset; available: always_on \(timing, watchdog, sentinel"


def names(config: verl_events.config.Config) -> list[str | None]:
    return [spec.name for spec in config.observers]


def test_always_on_expands_to_timing_watchdog_sentinel_mismatch_and_memory_with_their_defaults() -> None:
    config = load_config({"preset": "always_on"})
    assert names(config) == ALWAYS_ON
    assert config.preset == "always_on"
    for spec in config.observers:
        assert spec.preset == "always_on" and spec.enabled and spec.trigger is None
        # Each with its defaults, but the memory observer, which samples its peaks on its own thread.
        assert dict(spec.options) == ({"peak": "sampled"} if spec.name == "memory" else {}), spec
        assert spec.selection.steps is None and spec.selection.stages is None  # every stage of every step


def test_a_memory_entry_beside_the_preset_can_ask_for_exact_peaks_again() -> None:
    config = load_config({"preset": "always_on", "observers": [{"name": "memory", "peak": "reset"}]})
    assert names(config) == ALWAYS_ON
    assert dict(config.observers[-1].options) == {"peak": "reset"}


def test_the_name_alone_is_the_preset_where_a_config_file_is_expected() -> None:
    assert load_config("always_on").observers == load_config({"preset": "always_on"}).observers


def test_the_preset_writes_a_folder_per_run_unless_save_path_is_given() -> None:
    default = load_config({"preset": "always_on"})
    assert default.latest == Path("outputs/profile/latest")
    assert default.save_path.parent == Path("outputs/profile")
    given = load_config({"preset": "always_on", "save_path": "/shared/runs/a"})
    assert given.save_path == Path("/shared/runs/a") and given.latest is None


def test_an_entry_named_like_a_preset_observer_changes_that_observer_in_place() -> None:
    config = load_config(
        {
            "preset": "always_on",
            "observers": [
                {"name": "sentinel", "rules": {"actor/grad_norm": {"spike": True}}},
                {"name": "watchdog", "timeout_s": 600, "ranks": [0]},
                {"name": "mismatch", "enabled": False},
            ],
        }
    )
    assert names(config) == ALWAYS_ON
    timing, watchdog, sentinel, mismatch, memory = config.observers
    assert dict(watchdog.options) == {"timeout_s": 600} and watchdog.selection.ranks == frozenset({0})
    assert watchdog.where == "observers[1]" and watchdog.preset == "always_on"
    assert dict(sentinel.options) == {"rules": {"actor/grad_norm": {"spike": True}}}
    assert mismatch.enabled is False
    assert timing.where == "preset always_on's observers[0]" and not timing.options
    assert memory.where == "preset always_on's observers[4]" and dict(memory.options) == {"peak": "sampled"}


def test_other_entries_run_beside_the_preset_after_its_observers() -> None:
    config = load_config(
        {
            "preset": "always_on",
            "observers": [
                {"name": "recording", "steps": [1]},
                {"_target_": "verl_events.observers.timing:TimingObserver", "console": True},
            ],
        }
    )
    assert names(config) == [*ALWAYS_ON, "recording", None]  # a _target_ entry is never merged
    recording, second_timing = config.observers[len(ALWAYS_ON) :]
    assert recording.where == "observers[0]" and recording.preset is None
    assert second_timing.target == "verl_events.observers.timing:TimingObserver"


def test_dotlist_overrides_can_name_the_preset_and_change_its_observers() -> None:
    config = load_config({}, ["preset=always_on", "observers=[{name: watchdog, timeout_s: 60}]"])
    assert names(config) == ALWAYS_ON
    assert dict(config.observers[1].options) == {"timeout_s": 60}


def test_the_preset_joins_verls_own_form_and_keeps_verls_save_path() -> None:
    verl_form = {
        "preset": "always_on",
        "global_profiler": {"tool": "precision_debugger", "steps": [1], "save_path": "/shared/profile"},
        "actor_rollout_ref": {"actor": {"profiler": {"enable": True}}},
    }
    config = load_config(verl_form)
    assert names(config) == [*ALWAYS_ON, "msprobe"]
    assert config.save_path == Path("/shared/profile")
    verl_form["global_profiler"] = {"tool": "precision_debugger", "steps": [1]}  # no save_path: the preset's
    assert load_config(verl_form).latest == Path("outputs/profile/latest")


@pytest.mark.parametrize("value", ["alwayson", 3, ["always_on"], ""])
def test_an_unknown_preset_is_an_error_naming_the_key_the_value_and_the_presets(value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^preset: {value!r} {UNKNOWN_PRESET}".replace("[", r"\[")):
        load_config({"preset": value})


def test_a_bare_name_that_is_neither_a_file_nor_a_preset_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"config 'alwayson' is neither a file nor a preset; give a file's path \(\./alwayson for a file "
        r"without extension\) or a preset: always_on \(",
    ):
        load_config("alwayson")


def test_a_bare_name_that_is_a_file_and_no_preset_is_read_as_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("observers").write_text("observers:\n  - name: recording\n")
    assert names(load_config("observers")) == ["recording"]


def test_two_entries_changing_one_preset_observer_are_an_error() -> None:
    with pytest.raises(
        ConfigError,
        match=r"observers\[2\] \(watchdog\): observers\[0\] already changes preset always_on's watchdog; "
        r"put both entries' keys in one entry",
    ):
        load_config({"preset": "always_on", "observers": [{"name": "watchdog"}, {"name": "x"}, {"name": "watchdog"}]})


def test_a_bad_option_given_to_a_preset_observer_names_the_users_entry() -> None:
    config = load_config({"preset": "always_on", "observers": [{"name": "watchdog", "timeout": 5}]})
    with pytest.raises(ConfigError, match=r"observers\[0\] \(watchdog\): unknown option 'timeout'"):
        build_observers(config, set_up=False)
    bad_value = load_config({"preset": "always_on", "observers": [{"name": "watchdog", "timeout_s": -1}]})
    with pytest.raises(ConfigError, match=r"timeout_s: -1 is not allowed"):
        build_observers(bad_value, set_up=False)


def test_check_lists_what_the_preset_expands_to(capsys: pytest.CaptureFixture[str]) -> None:
    (command,) = entry_points(group="console_scripts", name="verl-events")
    assert command.load()(["check", "always_on"]) == 0
    shown = capsys.readouterr().out
    assert "save_path: outputs/profile/{run} (a folder per run" in shown
    listed = [line.split()[0] for line in shown.splitlines() if line.startswith("  ") and "priority=" in line]
    assert listed == ALWAYS_ON


def run_steps(steps: int, metric: float = 0.25) -> None:
    """verl's stages in verl's order, each handing its result to whoever asks: the actor's
    log-probs beside the rollout's (a small gap), and the update's metrics."""
    torch = pytest.importorskip("torch")  # verl's stages hand tensors; the mismatch observer reads them
    generator = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        rollout = -torch.rand(4, 8, generator=generator)
        batch = {"rollout_log_probs": rollout, "response_mask": torch.ones(4, 8, dtype=torch.bool)}
        results = {
            "rollout_generate": batch,
            "ref_compute_log_prob": {"ref_log_prob": rollout - 0.01},
            "actor_compute_log_prob": {"old_log_probs": rollout + 0.001},
            "actor_update": {"actor/pg_loss": metric, "actor/grad_norm": 0.5},
        }
        for name, result in results.items():
            update = stage(name, step=step, role="actor", inputs=batch)
            with update:
                update.set_result(result)


def test_an_installed_preset_writes_timings_and_heartbeats_and_no_anomaly_on_a_healthy_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with verl_events.install("always_on") as installation:
        save_path = installation.config.save_path
        assert [o.name for o in installation.observers] == ALWAYS_ON
        run_steps(3)
    assert Path("outputs/profile/latest").resolve() == save_path.resolve()
    records = [TimingRecord.from_json(line) for line in timing_log_path(save_path, 0).read_text().splitlines()]
    assert [(r.step, r.stage) for r in records][:2] == [(1, "rollout_generate"), (1, "ref_compute_log_prob")]
    assert len(records) == 12 and all(list(r.observers or ()) == ALWAYS_ON and not r.profiled for r in records)
    assert all(set(r.hook_s) == set(ALWAYS_ON) for r in records)
    (heartbeat,) = heartbeat_files(save_path)
    beat = read_heartbeat(heartbeat)
    assert beat.closed and beat.rank == 0 and beat.last_ended is not None
    assert (beat.last_ended["stage"], beat.last_ended["step"]) == ("actor_update", 3)
    assert not anomaly_log_path(save_path).exists()
    gaps = [MismatchRecord.from_json(line) for line in mismatch_log_path(save_path).read_text().splitlines()]
    assert [(g.step, g.missing) for g in gaps] == [(1, None), (2, None), (3, None)]
    assert all(g.stats is not None and g.stats["tokens"] == 32 and g.stats["nonfinite"] == 0 for g in gaps)


def test_the_presets_sentinel_fires_on_a_non_finite_metric(tmp_path: Path) -> None:
    """The healthy run's empty anomaly log means the sentinel looked: here it fires."""
    with verl_events.install({"preset": "always_on", "save_path": str(tmp_path / "run")}):
        run_steps(2, metric=math.nan)
    anomalies = [json.loads(line) for line in anomaly_log_path(tmp_path / "run").read_text().splitlines()]
    assert {(a["step"], a["stage"], a["metric"], a["rule"]) for a in anomalies} == {
        (1, "actor_update", "actor/pg_loss", "non_finite"),
        (2, "actor_update", "actor/pg_loss", "non_finite"),
    }


def test_the_documented_example_of_changing_the_preset_builds_what_it_says() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    (example,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", doc, flags=re.S) if b.startswith("preset: always_on\nsave")
    ]
    config = load_config(yaml.safe_load(example))
    assert names(config) == [*ALWAYS_ON, "msprobe"] and config.save_path.parent == Path("/shared/runs")
    pytest.importorskip("msprobe")  # building the example's msprobe entry needs its tool (the core suite has none)
    built = {o.name: o for o in build_observers(config, set_up=False)}
    assert list(built) == ["timing", "watchdog", "sentinel", "memory", "msprobe"]  # mismatch: enabled: false
    assert "deadline 900 s" in built["watchdog"].describe()
    assert "rules for: actor/grad_norm" in built["sentinel"].describe()
