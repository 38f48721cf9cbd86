"""The verl bridge against real verl 0.9.1: its DistProfiler, DistProfilerExtension,
@register and @DistProfiler.annotate, DataProto, and the trainer's start/stop calls."""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")  # the bridge wraps verl's own classes
import numpy as np  # noqa: E402
import verl  # noqa: E402
import verl.utils.profiler as verl_profiler
from verl.utils.profiler import DistProfiler, ProfilerConfig
from verl.utils.profiler.config import TorchProfilerToolConfig

import verl_events
from verl_events import ConfigError, StageEnd, VerlEventsWarning
from verl_events.config import load_config
from verl_events.testing import RecordingObserver, capture_events
from verl_events.verl_bridge import VerlBridgeError, install_verl_bridge, uninstall_verl_bridge

from .observers.support import write_msprobe_config
from .support import run_two_gloo_ranks
from .verl_workers import ActorRolloutRefWorker, CriticWorker, batch, train_step

REPO = Path(__file__).parent.parent
GUIDE_STAGES = ("actor_compute_log_prob", "actor_update", "ref_compute_log_prob")
pytestmark = pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")


@pytest.fixture
def bridge() -> Any:
    install_verl_bridge()
    yield
    uninstall_verl_bridge()


def begins(events: list[Any]) -> list[Any]:
    return [e for e in events if not isinstance(e, StageEnd)]


def dumps_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("dump.json"))


def test_bridge_off_means_no_events_and_verl_untouched() -> None:
    original = ActorRolloutRefWorker.__dict__["update_actor"]
    with capture_events() as events:
        train_step(ActorRolloutRefWorker(), CriticWorker(), 1, profiled=True)
    assert events == []
    assert ActorRolloutRefWorker.__dict__["update_actor"] is original


def test_annotated_methods_emit_stage_role_step_rank_and_model(bridge: None) -> None:
    actor, critic = ActorRolloutRefWorker(), CriticWorker()
    with capture_events() as events:
        train_step(actor, critic, 3, profiled=True)
    seen = [(e.stage, e.role, e.step, e.rank) for e in begins(events)]
    assert seen == [
        ("rollout_generate", "rollout", 3, 0),
        ("ref_compute_log_prob", "ref", 3, 0),
        ("actor_compute_log_prob", "actor", 3, 0),
        ("compute_values", "critic", 3, 0),
        ("critic_update", "critic", 3, 0),
        ("actor_update", "actor", 3, 0),
    ]
    models = {e.stage: e.model for e in begins(events)}
    assert models["actor_update"] is actor.actor.engine.module
    assert models["ref_compute_log_prob"] is actor.ref.engine.module
    assert models["compute_values"] is critic.critic.engine.module


def test_outside_profiled_steps_the_step_comes_only_from_meta_info(bridge: None) -> None:
    actor = ActorRolloutRefWorker()
    with capture_events() as events:
        train_step(actor, None, 1, profiled=True)
        train_step(actor, None, 2, profiled=False)
    steps = [(e.stage, e.step) for e in begins(events) if e.stage in ("rollout_generate", "actor_update")]
    # stop_profile forgets step 1; step 2's generation batch carries its step in meta_info.
    assert steps == [("rollout_generate", 1), ("actor_update", 1), ("rollout_generate", 2), ("actor_update", None)]


def engine_batch(weight_version: int, seed: int = 0) -> Any:
    """What verl 0.9.1's trainer hands an engine worker's stage: DataProto.to_tensordict()
    of a batch whose per-sample "global_steps" is the rollout's weight version."""
    data = batch(seed=seed)
    data.non_tensor_batch["global_steps"] = np.array([weight_version] * len(data), dtype=object)
    return data.to_tensordict()


def test_the_step_follows_update_weights_on_every_step_profiled_or_not(bridge: None) -> None:
    actor = ActorRolloutRefWorker()
    with capture_events() as events:
        asyncio.run(actor.update_weights(global_steps=0))  # the trainer, before step 1
        for step in (1, 2, 3):
            if step == 2:
                actor.start_profile(role="train", profile_step=step)
            data = engine_batch(weight_version=step - 1, seed=step)  # one behind: never the step
            actor.compute_log_prob(data)
            actor.update_actor(data)
            asyncio.run(actor.update_weights(global_steps=step, mode="naive"))
            if step == 2:
                actor.stop_profile()
    # The sync is a stage of its own, the rollout waking up twice inside it: the step whose
    # weights it sends (0: the starting weights).
    sync = ("update_weights", "rollout_wake_up", "rollout_wake_up")
    assert [(e.stage, e.step) for e in begins(events)] == [
        *((stage, 0) for stage in sync),
        *((stage, step) for step in (1, 2, 3) for stage in ("actor_compute_log_prob", "actor_update", *sync)),
    ]
    assert inspect.iscoroutinefunction(ActorRolloutRefWorker.update_weights)  # Ray runs it as async still


def test_a_per_sample_step_list_is_passed_over_for_the_announced_step(bridge: None) -> None:
    actor = ActorRolloutRefWorker()
    with capture_events() as events:
        actor.start_profile(role="train", profile_step=4)
        actor.compute_log_prob(engine_batch(weight_version=3))
        actor.stop_profile()
    assert [(e.stage, e.step) for e in begins(events)] == [("actor_compute_log_prob", 4)]


@pytest.mark.filterwarnings("ignore:Ray state API is no longer experimental:DeprecationWarning")
def test_bridged_worker_classes_pickle_for_ray_and_emit_where_they_land(bridge: None, tmp_path: Path) -> None:
    """Ray pickles a worker class defined in a function by value, with every method it
    records (also __init_subclass__): verl's colocated WorkerDict, or a user's subclass."""
    import ray
    from ray import cloudpickle
    from verl.single_controller.ray.base import RayClassWithInitArgs, create_colocated_worker_cls
    from verl.workers import engine_workers

    def local_worker_class() -> type:
        class MyActorWorker(ActorRolloutRefWorker):
            @DistProfiler.annotate(color="red", role="actor_update")
            def update_actor(self, data: Any) -> float:
                return 1.5

        return MyActorWorker

    recorder = RecordingObserver()
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "timing"}]}, observers=[recorder]):
        colocated = create_colocated_worker_cls(
            {"actor_rollout": RayClassWithInitArgs(cls=ray.remote(engine_workers.ActorRolloutRefWorker))}
        )
        cloudpickle.dumps(colocated.cls.__ray_metadata__.modified_class)
        mine = ray.remote(local_worker_class())
        copy = cloudpickle.loads(cloudpickle.dumps(mine.__ray_metadata__.modified_class))
        assert copy().update_actor(batch(7)) == 1.5
    assert [(e.stage, e.step) for e in begins(recorder.events)] == [("actor_update", 7)]


def test_install_is_idempotent_and_uninstall_restores_verl_exactly() -> None:
    originals = {name: ActorRolloutRefWorker.__dict__[name] for name in ("update_actor", "compute_log_prob")}
    start, stop = DistProfiler.__dict__["start"], DistProfiler.__dict__["stop"]
    install_verl_bridge()
    install_verl_bridge()
    try:
        with capture_events() as events:
            ActorRolloutRefWorker().update_actor(batch(1))
        assert len(events) == 2  # one begin, one end: not wrapped twice
    finally:
        uninstall_verl_bridge()
        uninstall_verl_bridge()
    assert {name: ActorRolloutRefWorker.__dict__[name] for name in originals} == originals
    assert (DistProfiler.__dict__["start"], DistProfiler.__dict__["stop"]) == (start, stop)
    assert "__init_subclass__" not in verl_profiler.DistProfilerExtension.__dict__


def test_the_stage_runs_inside_transferqueues_bridge_with_registers_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """verl's @register puts TransferQueue's tqbridge around the method: on the v1 trainer it
    fetches the batch a handle names, calls the method and puts the result back.  The stage
    goes inside it, so it sees the tensors and not the fetch, and the method keeps @register's
    dispatch arguments.  TransferQueue is not installed here: tqbridge's own code runs, and
    passes the DataProto through, as on the v0 trainer."""
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.utils import transferqueue_utils

    original = ActorRolloutRefWorker.__dict__["update_actor"]
    install_verl_bridge()
    try:
        bridged = ActorRolloutRefWorker.__dict__["update_actor"]
        assert getattr(bridged, MAGIC_ATTR) == getattr(original, MAGIC_ATTR)
        tqbridge_code = transferqueue_utils.tqbridge()(lambda: None).__code__
        assert bridged.__wrapped__.__code__ is tqbridge_code
        assert bridged.__wrapped__.__wrapped__.__wrapped__ is original.__wrapped__.__wrapped__  # annotate(f)
        recorder = RecordingObserver()
        seen_by_bridge: list[int] = []
        find_meta = transferqueue_utils._find_meta

        def looking_for_a_handle(*args: Any, **kwargs: Any) -> Any:
            seen_by_bridge.append(len(recorder.calls))  # the observer calls made before the bridge ran
            return find_meta(*args, **kwargs)

        monkeypatch.setattr(transferqueue_utils, "_find_meta", looking_for_a_handle)
        with verl_events.install(observers=[recorder]):
            ActorRolloutRefWorker().update_actor(batch(1))
        assert seen_by_bridge == [0] and [call[0] for call in recorder.calls] == ["begin", "end"]
    finally:
        uninstall_verl_bridge()
    assert ActorRolloutRefWorker.__dict__["update_actor"] is original


def test_worker_classes_defined_after_install_are_bridged(bridge: None) -> None:
    class LateWorker(verl_profiler.DistProfilerExtension):  # type: ignore[misc]
        def __init__(self) -> None:
            verl_profiler.DistProfilerExtension.__init__(self, DistProfiler(rank=0, config=None))

        @DistProfiler.annotate(role="compute_rm_score")
        def compute_rm_score(self, data: Any) -> int:
            return 7

    with capture_events() as events:
        assert LateWorker().compute_rm_score(batch(5)) == 7
    assert [(e.stage, e.role, e.step) for e in begins(events)] == [("compute_rm_score", "reward_model", 5)]


def test_the_stage_runs_once_whatever_the_observers_do(bridge: None) -> None:
    actor = ActorRolloutRefWorker()
    broken = RecordingObserver(fail_on="begin")
    with verl_events.install(observers=[broken]):
        train_step(actor, None, 1, profiled=True)
    assert actor.call_counts() == {
        "generate_sequences": 1,
        "compute_ref_log_prob": 1,
        "compute_log_prob": 1,
        "update_actor": 1,
    }
    assert len(broken.calls) == 8


def test_verls_own_profiler_keeps_working_beside_the_bridge(bridge: None, tmp_path: Path) -> None:
    config = ProfilerConfig(
        tool="torch",
        enable=True,
        all_ranks=True,
        save_path=str(tmp_path),
        tool_config=TorchProfilerToolConfig(discrete=True),
    )
    actor = ActorRolloutRefWorker(profiler=DistProfiler(rank=0, config=config, tool_config=config.tool_config))
    with capture_events() as events:
        actor.start_profile(role="train", profile_step=1)
        actor.update_actor(batch())
        actor.stop_profile()
    assert [(e.stage, e.step) for e in begins(events)] == [("actor_update", 1)]
    assert [p.name.split("_pid")[0] for p in tmp_path.glob("*.json.gz")] == ["actor-update_step1_rank0"]


@pytest.mark.parametrize(("owner", "name"), [(DistProfiler, "stop"), (verl_profiler, "DistProfilerExtension")])
def test_a_verl_without_what_the_bridge_needs_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str
) -> None:
    monkeypatch.delattr(owner, name)
    version = re.escape(verl.__version__)
    with pytest.raises(
        VerlBridgeError,
        match=rf"verl {version} lacks verl\.utils\.profiler\.(DistProfiler\.)?{name}, "
        r"which the verl_events bridge relies on",
    ):
        install_verl_bridge()
    assert not verl_events.verl_bridge.verl_bridge_installed()


# -- verl's config, unchanged ---------------------------------------------------------

GUIDE_MINIMAL_EXAMPLE = """
global_profiler:
  tool: precision_debugger
  steps: [1, 2]
  global_tool_config:
    precision_debugger:
      _target_: verl.utils.profiler.config.PrecisionDebuggerToolConfig
      config_path: {config_path}
      stages:
        - actor_compute_log_prob
        - ref_compute_log_prob
        - actor_update
      strict: False

actor_rollout_ref:
  actor:
    profiler:
      enable: True
  ref:
    profiler:
      enable: True
"""


def test_the_guides_minimal_example_writes_the_guides_output_layout(
    bridge: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "verl.yaml"
    config.write_text(GUIDE_MINIMAL_EXAMPLE.format(config_path=write_msprobe_config(tmp_path / "dump_config.json")))
    actor, critic = ActorRolloutRefWorker(), CriticWorker()
    with verl_events.install(config):
        for step in (1, 2, 3):
            train_step(actor, critic, step, profiled=step in (1, 2))  # the trainer profiles global_profiler.steps
    assert dumps_under(tmp_path / "outputs/profile") == [
        f"step_{step}/{stage}/step0/rank0/dump.json" for step in (1, 2) for stage in GUIDE_STAGES
    ]


def test_roles_not_enabled_are_not_observed_and_rollout_is_skipped(bridge: None, tmp_path: Path) -> None:
    raw = {
        "global_profiler": {
            "tool": "precision_debugger",
            "steps": [1],
            "save_path": str(tmp_path / "p"),
            "global_tool_config": {"precision_debugger": {"config_path": None, "stages": None}},
        },
        "actor_rollout_ref": {
            "actor": {"profiler": {"enable": True}},
            "ref": {"profiler": {"enable": False}},
            "rollout": {"profiler": {"enable": True}},
        },
        "critic": {"profiler": {"enable": False}},
        "trainer": {"total_epochs": 1},  # the rest of a verl config is verl's business
    }
    with verl_events.install(raw):
        train_step(ActorRolloutRefWorker(), CriticWorker(), 1, profiled=True)
    assert dumps_under(tmp_path / "p") == [
        f"step_1/{stage}/step0/rank0/dump.json" for stage in ("actor_compute_log_prob", "actor_update")
    ]


def test_deprecated_precision_debugger_steps_warns_as_verl_does(tmp_path: Path) -> None:
    raw = {
        "global_profiler": {
            "tool": "precision_debugger",
            "steps": [1],
            "save_path": str(tmp_path),
            "global_tool_config": {"precision_debugger": {"steps": [1, 2]}},
        },
        "actor_rollout_ref": {"actor": {"profiler": {"enable": True}}},
    }
    with pytest.warns(VerlEventsWarning, match="precision_debugger.steps is deprecated and ignored, as in verl"):
        config = load_config(raw)
    assert config.observers[0].selection.steps == {1}


def test_rollout_generate_in_stages_is_dropped_with_a_warning(tmp_path: Path) -> None:
    raw = {
        "global_profiler": {
            "tool": "precision_debugger",
            "steps": [1],
            "save_path": str(tmp_path),
            "global_tool_config": {"precision_debugger": {"stages": ["rollout_generate", "actor_update"]}},
        },
        "actor_rollout_ref": {"actor": {"profiler": {"enable": True}}},
    }
    with pytest.warns(VerlEventsWarning, match="rollout_generate is skipped, as in verl"):
        config = load_config(raw)
    assert config.observers[0].selection.stages == {"actor_update"}


@pytest.mark.parametrize("tool", ["torch_memory", "nsight"])
def test_tools_without_an_observer_are_a_clear_error(tool: str) -> None:
    with pytest.raises(
        ConfigError,
        match=rf"global_profiler.tool: '{tool}' has no verl_events observer; "
        r"supported: precision_debugger, nsys, npu, torch",
    ):
        load_config({"global_profiler": {"tool": tool, "steps": [1]}})


def test_null_steps_profile_nothing_as_in_verl() -> None:
    with pytest.warns(VerlEventsWarning, match="global_profiler.steps is null, so precision_debugger profiles nothing"):
        config = load_config(
            {
                "global_profiler": {"tool": "precision_debugger", "steps": None},
                "actor_rollout_ref": {"actor": {"profiler": {"enable": True}}},
            }
        )
    assert config.observers == ()


def test_verl_torch_tool_maps_to_our_torch_profiler_with_verls_rank_rule() -> None:
    raw = {
        "global_profiler": {"tool": "torch", "steps": [2]},
        "actor_rollout_ref": {
            "actor": {
                "profiler": {
                    "enable": True,
                    "ranks": [1],
                    "tool_config": {"torch": {"contents": ["cpu"], "discrete": True}},
                }
            }
        },
        "observers": [{"name": "timing"}],
    }
    torch_profiler, timing = load_config(raw).observers
    assert torch_profiler.name == "torch_profiler" and dict(torch_profiler.options) == {
        "contents": ["cpu"],
        "discrete": True,
    }
    assert torch_profiler.selection.ranks == {1} and torch_profiler.selection.roles == {"actor"}
    assert timing.name == "timing"


# -- processes: two gloo ranks, and Ray actors ------------------------------------------


@pytest.mark.slow
def test_two_processes_dump_under_the_same_step_and_stage(tmp_path: Path) -> None:
    config = tmp_path / "verl.yaml"
    config.write_text(GUIDE_MINIMAL_EXAMPLE.format(config_path=write_msprobe_config(tmp_path / "dump_config.json")))
    result = run_two_gloo_ranks(
        tmp_path,
        f"""
            import verl_events
            from verl_events.verl_bridge import install_verl_bridge
            from tests.verl_workers import ActorRolloutRefWorker, train_step
            install_verl_bridge()
            with verl_events.install({str(config)!r}):
                worker = ActorRolloutRefWorker(rank=rank)
                for step in (1, 2, 3):
                    train_step(worker, None, step, profiled=step in (1, 2))
            dist.barrier()
            dist.destroy_process_group()
        """,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert dumps_under(tmp_path / "outputs/profile") == sorted(
        f"step_{step}/{stage}/step0/rank{rank}/dump.json"
        for step in (1, 2)
        for stage in GUIDE_STAGES
        for rank in (0, 1)
    )


@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)
@pytest.mark.slow
def test_ray_actors_are_bridged_by_the_documented_switch_alone(tmp_path: Path) -> None:
    import ray

    config = tmp_path / "verl.yaml"
    config.write_text(
        GUIDE_MINIMAL_EXAMPLE.replace(
            "  steps: [1, 2]", f"  steps: [1, 2]\n  save_path: {tmp_path / 'profile'}"
        ).format(config_path=write_msprobe_config(tmp_path / "dump_config.json"))
    )
    runtime_env = {
        # The switch docs/verl.md documents: a setup hook and the config's path.
        "worker_process_setup_hook": "verl_events.verl_bridge.setup_worker",
        "env_vars": {"VERL_EVENTS_CONFIG": str(config), "PYTHONPATH": str(REPO)},
    }
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=runtime_env, log_to_driver=False)
    try:
        from .verl_workers import ActorRolloutRefWorker as Worker

        # verl's RayWorkerGroup gives each worker its RANK the same way.
        actors = [
            ray.remote(Worker).options(runtime_env={"env_vars": {"RANK": str(rank)}}).remote(rank=rank)
            for rank in (0, 1)
        ]
        for step in (1, 2, 3):
            profiled = step in (1, 2)
            if profiled:
                ray.get([a.start_profile.remote(role="train", profile_step=step) for a in actors])
            data = batch(seed=step)
            ray.get([a.generate_sequences.remote(batch(step)) for a in actors])
            ray.get([a.compute_ref_log_prob.remote(data) for a in actors])
            ray.get([a.compute_log_prob.remote(data) for a in actors])
            ray.get([a.update_actor.remote(data) for a in actors])
            if profiled:
                ray.get([a.stop_profile.remote() for a in actors])
        counts = ray.get([a.call_counts.remote() for a in actors])
    finally:
        ray.shutdown()
    assert (
        counts == [{"generate_sequences": 3, "compute_ref_log_prob": 3, "compute_log_prob": 3, "update_actor": 3}] * 2
    )
    assert dumps_under(tmp_path / "profile") == sorted(
        f"step_{step}/{stage}/step0/rank{rank}/dump.json"
        for step in (1, 2)
        for stage in GUIDE_STAGES
        for rank in (0, 1)
    )


def test_a_subclass_hook_verl_defines_is_kept_and_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def verl_hook(cls: type, **kwargs: Any) -> None:
        seen.append(cls.__name__)

    hook = classmethod(verl_hook)
    monkeypatch.setattr(verl_profiler.DistProfilerExtension, "__init_subclass__", hook, raising=False)
    install_verl_bridge()
    try:

        class Later(verl_profiler.DistProfilerExtension):  # type: ignore[misc]
            @DistProfiler.annotate(role="actor_update")
            def update_actor(self) -> None: ...

        assert seen == ["Later"]
        assert hasattr(Later.__dict__["update_actor"], "__verl_events_bridged__")
    finally:
        uninstall_verl_bridge()
    assert verl_profiler.DistProfilerExtension.__dict__["__init_subclass__"] is hook


def test_verls_form_is_checked_like_ours_and_a_string_is_not_a_bool() -> None:
    raw = {
        "global_profiler": {"tool": "torch", "steps": [2]},
        "actor_rollout_ref": {"actor": {"profiler": {"enable": True, "tool_config": {"torch": {"discrete": "no"}}}}},
    }
    with pytest.raises(
        ConfigError, match=r"\(torch_profiler\): option discrete: 'no' is not allowed; use true or false"
    ):
        verl_events.install(raw)
