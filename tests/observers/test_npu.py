"""NpuProfilerObserver.  torch_npu cannot run here (it needs Ascend hardware), so these
tests install a stand-in whose callables carry the real torch_npu 2.7.1 signatures
(tests/observers/fixtures/torch_npu_api.py names the wheel and lines) and bind every
call against them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import verl_events
from verl_events import ConfigError, ObserverSetupError, VerlEventsWarning, stage

from .fixtures.torch_npu_api import install_fake_torch_npu


def npu_config(tmp_path: Path, **options: object) -> dict[str, object]:
    return {"save_path": str(tmp_path), "observers": [{"name": "npu", **options}]}


def test_discrete_mode_profiles_each_selected_stage_into_the_stage_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = install_fake_torch_npu(monkeypatch)
    options = {"level": "level1", "contents": ["npu", "cpu", "shapes", "module"], "analysis": False, "steps": [1]}
    with verl_events.install(npu_config(tmp_path, **options)):
        for step in (1, 2):
            with stage("actor_update", step=step):
                pass
    names = [name for name, _ in calls]
    assert names == [
        "_ExperimentalConfig",
        "tensorboard_trace_handler",
        "profile",
        "profile.start",
        "profile.stop",
        "on_trace_ready",
    ]
    config, handler, profile = (args for _, args in calls[:3])
    assert config["profiler_level"] == "Level1" and config["data_simplification"] is True
    assert handler == {
        "dir_name": str(tmp_path / "step_1/actor_update/npu_profiler_step_1_actor_update_rank0"),
        "worker_name": "rank0",
        "analyse_flag": False,
    }
    assert profile["activities"] == ["ProfilerActivity.CPU", "ProfilerActivity.NPU"]
    assert (profile["record_shapes"], profile["with_modules"], profile["profile_memory"], profile["with_stack"]) == (
        True,
        True,
        False,
        False,
    )


def test_continuous_mode_opens_one_profile_for_consecutive_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = install_fake_torch_npu(monkeypatch)
    with verl_events.install(npu_config(tmp_path, discrete=False, steps=["2-3"])):
        for step in (1, 2, 3, 4):
            for name in ("actor_compute_log_prob", "actor_update"):
                with stage(name, step=step):
                    pass
    assert [name for name, _ in calls].count("profile.start") == 1
    assert [name for name, _ in calls][-2:] == ["profile.stop", "on_trace_ready"]
    handler = dict(calls)["tensorboard_trace_handler"]
    assert handler["dir_name"] == str(tmp_path / "step_2/npu_profiler_step_2-2_rank0")


def test_empty_contents_profile_cpu_and_npu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = install_fake_torch_npu(monkeypatch)
    with verl_events.install(npu_config(tmp_path)):
        with stage("actor_update", step=1):
            pass
    assert dict(calls)["profile"]["activities"] == ["ProfilerActivity.CPU", "ProfilerActivity.NPU"]
    assert dict(calls)["_ExperimentalConfig"]["profiler_level"] == "Level0"


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"level": "level3"}, r"level: 'level3' is not allowed; allowed: level_none, level0, level1, level2"),
        ({"contents": ["gpu"]}, r"contents: 'gpu' is not allowed; allowed: npu, cpu, memory, shapes, module, stack"),
        ({"analysis": "yes"}, r"analysis: 'yes' is not allowed"),
        ({"discrete": 1}, r"discrete: 1 is not allowed"),
    ],
)
def test_bad_options_list_what_is_allowed(tmp_path: Path, options: dict, pattern: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=pattern):
        verl_events.install(npu_config(tmp_path, **options))


def test_without_torch_npu_the_observer_warns_and_stays_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.warns(VerlEventsWarning, match=r"torch_npu is not importable .* The npu observer is off"):
        installation = verl_events.install(npu_config(tmp_path))
    with installation:
        with stage("actor_update", step=1):
            pass


def test_without_torch_npu_strict_install_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(ObserverSetupError, match=r"\(npu\) failed to set up: ImportError: torch_npu is not importable"):
        verl_events.install({**npu_config(tmp_path), "strict": True})


def test_npu_and_torch_profiler_on_one_stage_are_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch_npu(monkeypatch)
    config = {
        "save_path": str(tmp_path),
        "observers": [{"name": "torch_profiler", "steps": [1]}, {"name": "npu", "steps": [1]}],
    }
    with pytest.raises(ConfigError, match=r"observers 'torch_profiler' and 'npu' both need 'kineto'"):
        verl_events.install(config)
