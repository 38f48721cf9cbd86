"""The emit API: stage(), emits_stage, step/rank/model resolution, nesting, threads."""

from __future__ import annotations

import logging
import re
import threading
from types import SimpleNamespace
from typing import Any

import pytest

import verl_events
from verl_events import ConfigError, Observer, StageEnd, StageEvent, emits_stage, stage
from verl_events.testing import RecordingObserver, capture_events

try:  # the core suite runs without numpy and torch; their step types are checked when present
    import numpy
    import torch
except ImportError:
    numpy = torch = None  # type: ignore[assignment]
TENSOR_STEPS = [numpy.int64(3), torch.tensor(3)] if torch is not None else []


class Net:
    """What the model resolver takes for a model: anything with a forward."""

    def forward(self, x: Any) -> Any:
        return x


class DataProtoLike:
    """Just the part of verl's DataProto that step resolution reads."""

    def __init__(self, global_steps: Any) -> None:
        self.meta_info = {"global_steps": global_steps}


class Worker:
    def __init__(self) -> None:
        self.actor = SimpleNamespace(engine=SimpleNamespace(module=Net()))
        self.calls = 0

    @emits_stage("actor_update")
    def update_actor(self, data: Any) -> str:
        self.calls += 1
        return "updated"

    @emits_stage("my_custom_stage", role="critic")
    def custom(self, data: Any = None) -> None:
        self.calls += 1

    @emits_stage("actor_update")
    def fails(self) -> None:
        self.calls += 1
        raise RuntimeError("stage body failed")


def begins(events: list[Any]) -> list[Any]:
    return [e for e in events if not isinstance(e, StageEnd)]


def test_nothing_listening_runs_the_body_once_and_builds_no_event() -> None:
    worker = Worker()
    assert worker.update_actor(DataProtoLike(1)) == "updated"
    assert worker.calls == 1
    with stage("actor_update") as event:
        assert event is None


def test_decorator_keeps_the_method_name_and_return_value() -> None:
    worker = Worker()
    with capture_events():
        assert worker.update_actor(DataProtoLike(1)) == "updated"
    assert Worker.update_actor.__name__ == "update_actor"


def test_step_comes_from_meta_info_first() -> None:
    worker = Worker()
    worker.global_step = 9  # type: ignore[attr-defined]
    verl_events.set_step(11)
    with capture_events() as events:
        worker.update_actor(DataProtoLike(3))
    assert begins(events)[0].step == 3


def test_step_comes_from_a_dict_argument() -> None:
    with capture_events() as events:
        Worker().update_actor({"global_steps": torch.tensor(5) if torch is not None else 5})
    assert begins(events)[0].step == 5


@pytest.mark.parametrize("attr", ["global_step", "_global_step"])
def test_step_falls_back_to_worker_attributes(attr: str) -> None:
    worker = Worker()
    setattr(worker, attr, 7)
    verl_events.set_step(11)
    with capture_events() as events:
        worker.update_actor(object())
    assert begins(events)[0].step == 7


def test_step_falls_back_to_the_announced_step_then_none() -> None:
    worker = Worker()
    with capture_events() as events:
        worker.update_actor(object())
        verl_events.set_step(12)
        worker.update_actor(object())
    assert [e.step for e in begins(events)] == [None, 12]


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True, *([torch.tensor(True)] if torch is not None else [])])
def test_set_step_rejects_non_steps(bad: Any) -> None:
    with pytest.raises(ValueError, match="is not a step"):
        verl_events.set_step(bad)


@pytest.mark.parametrize("bad", ["x", -3, True, 1.5])
def test_stage_refuses_a_bad_step_with_set_steps_sentence(bad: Any) -> None:
    sentence = f"{bad!r} is not a step; use a non-negative int, or None for no step"
    with pytest.raises(ValueError, match=re.escape(f"set_step: {sentence}")):
        verl_events.set_step(bad)
    body_ran = False
    with capture_events() as events:
        with pytest.raises(ValueError, match=re.escape(f"stage('actor_update', step=...): {sentence}")):
            with stage("actor_update", step=bad):
                body_ran = True
    assert (events, body_ran) == ([], False)


@pytest.mark.parametrize("step", [*TENSOR_STEPS, 3])
def test_stage_takes_numpy_and_tensor_integer_steps_as_plain_ints(step: Any) -> None:
    with capture_events() as events:
        with stage("actor_update", step=step):
            pass
    assert [(type(e.step), e.step) for e in events] == [(int, 3), (int, 3)]


def test_a_bad_step_is_not_checked_when_nothing_listens() -> None:
    with stage("actor_update", step="x") as event:  # type: ignore[arg-type]
        assert event is None


@pytest.mark.parametrize("bad", [-3, True, "2"])
def test_a_found_value_that_is_not_a_step_is_passed_over(bad: Any) -> None:
    verl_events.set_step(12)
    with capture_events() as events:
        Worker().update_actor(DataProtoLike(bad))
    assert begins(events)[0].step == 12


def test_rank_comes_from_the_environment_without_torch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with capture_events() as events:
        with stage("actor_update", step=1):
            pass
    assert (events[0].rank, events[0].world_size) == (3, 8)


def test_a_stage_may_name_the_rank_it_works_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollout server prefilling trainer rank 1's sequences speaks for rank 1 (docs/mismatch.md)."""
    monkeypatch.setenv("RANK", "0")
    with capture_events() as events:
        with stage("rollout_prefill", step=2, rank=1):
            pass
    assert (events[0].stage, events[0].role, events[0].rank) == ("rollout_prefill", "rollout", 1)
    for bad in (-2, True, "1"):
        with pytest.raises(ValueError, match=f"rank {bad!r} is not allowed; use an integer >= 0, DRIVER_RANK"):
            stage("rollout_prefill", rank=bad)  # type: ignore[arg-type]


def test_verls_driver_has_a_rank_of_its_own_that_only_observers_asking_for_it_see(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver's wait for generation is filed under DRIVER_RANK, never under rank 0, and
    reaches only the observers that set ``sees_driver`` (the timing observer does)."""
    monkeypatch.setenv("RANK", "0")
    seen: dict[str, list[tuple[str, int]]] = {"asks": [], "plain": []}

    class Asks(Observer):
        sees_driver = True

        def on_stage_begin(self, event: StageEvent) -> None:
            seen["asks"].append((event.stage, event.rank))

    class Plain(Observer):
        def on_stage_begin(self, event: StageEvent) -> None:
            seen["plain"].append((event.stage, event.rank))

    with verl_events.install(observers=[Asks(), Plain()]):
        with stage("rollout_generate", step=2, rank=verl_events.DRIVER_RANK):
            pass
        with stage("actor_update", step=2):
            pass
    assert seen["asks"] == [("rollout_generate", -1), ("actor_update", 0)]
    assert seen["plain"] == [("actor_update", 0)]
    assert [verl_events.rank_name(rank) for rank in (-1, 0)] == ["driver", "rank 0"]


def test_a_bad_rank_variable_warns_once_and_uses_zero(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RANK", "abc")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with capture_events() as events:
        for _ in range(2):
            with stage("actor_update", step=1):
                pass
    assert events[0].rank == 0
    assert [r.getMessage() for r in caplog.records] == ["environment variable RANK='abc' is not an integer; using 0"]


def test_model_is_resolved_through_verl_candidate_paths() -> None:
    worker = Worker()
    with capture_events() as events:
        worker.update_actor(DataProtoLike(1))
    event = begins(events)[0]
    assert event.model is worker.actor.engine.module
    assert event.model_paths[0] == "actor.engine.module" and event.model_paths[-1] == "module"


def test_model_chunks_are_kept_as_a_list() -> None:
    worker = Worker()
    chunks = [Net(), Net()]
    worker.actor = SimpleNamespace(actor_module=chunks)
    with capture_events() as events:
        worker.update_actor(DataProtoLike(1))
    assert begins(events)[0].model is chunks


def test_user_model_paths_are_tried_first() -> None:
    worker = Worker()
    worker.policy = SimpleNamespace(net=Net())  # type: ignore[attr-defined]
    verl_events.add_model_paths("actor", "policy.net")
    with capture_events() as events:
        worker.update_actor(DataProtoLike(1))
    assert begins(events)[0].model is worker.policy.net  # type: ignore[attr-defined]


def test_add_model_paths_rejects_non_paths() -> None:
    with pytest.raises(ValueError, match="not a dotted attribute path"):
        verl_events.add_model_paths("actor", "actor/engine")


class NeedsModel(RecordingObserver):
    needs_model = True


def test_missing_model_warns_once_naming_stage_role_and_every_path(caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker()
    del worker.actor
    observer = NeedsModel()
    observer.name = "dumper"
    with verl_events.install(observers=[observer]):
        worker.update_actor(DataProtoLike(1))
        worker.update_actor(DataProtoLike(2))
    [record] = [r for r in caplog.records if r.name == "verl_events"]
    message = record.getMessage()
    assert record.levelno == logging.WARNING
    assert "model not resolved for stage 'actor_update' (role 'actor', step 1): observer 'dumper' needs one" in message
    assert (
        "actor.engine.module, actor.actor_module, actor.actor_module_fsdp, actor_module_fsdp, actor_module, module"
        in message
    )
    assert len(observer.calls) == 4  # the stage still reaches the observer


def test_no_warning_when_no_observer_needs_a_model(caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker()
    del worker.actor
    with verl_events.install(observers=[RecordingObserver()]):
        worker.update_actor(DataProtoLike(1))
    assert not caplog.records


def test_role_defaults_to_the_role_verl_runs_the_stage_in() -> None:
    with capture_events() as events:
        Worker().custom()
        with stage("ref_compute_log_prob"):
            pass
        with stage("unknown_custom"):
            pass
    assert [e.role for e in begins(events)] == ["critic", "ref", None]


def test_the_body_exception_propagates_unchanged_and_the_body_runs_once() -> None:
    worker = Worker()
    with capture_events() as events:
        with pytest.raises(RuntimeError, match="stage body failed"):
            worker.fails()
    assert worker.calls == 1
    assert isinstance(events[1], StageEnd) and isinstance(events[1].error, RuntimeError)


def test_bad_stage_names_fail_at_decoration_time() -> None:
    with pytest.raises(ConfigError, match="'a/b' is not a valid stage name"):
        emits_stage("a/b")


def test_bad_stage_names_fail_in_stage_when_someone_listens() -> None:
    with capture_events():
        with pytest.raises(ConfigError, match="'../x' is not a valid stage name"):
            with stage("../x"):
                pass


def test_nested_stages_carry_depth_and_parent_and_close_inner_first() -> None:
    with capture_events() as events:
        with stage("actor_update", step=1):
            with stage("forward_backward", step=1):
                pass
    assert [(e.stage, type(e).__name__, e.depth, e.parent) for e in events] == [
        ("actor_update", "StageEvent", 0, None),
        ("forward_backward", "StageEvent", 1, "actor_update"),
        ("forward_backward", "StageEnd", 1, "actor_update"),
        ("actor_update", "StageEnd", 0, None),
    ]


def test_threads_keep_separate_stacks_and_every_begin_is_paired() -> None:
    rec = RecordingObserver()
    barrier = threading.Barrier(4)

    def work(index: int) -> None:
        barrier.wait()
        for step in range(20):
            with stage("compute_values", step=step, thread=index):
                with stage("critic_update", step=step, thread=index):
                    pass

    with verl_events.install(observers=[rec]):
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    by_seq: dict[int, list[str]] = {}
    for event in rec.events:
        by_seq.setdefault(event.seq, []).append(type(event).__name__)
        if event.stage == "compute_values":
            assert (event.depth, event.parent) == (0, None)
        else:
            assert (event.depth, event.parent) == (1, "compute_values")
    assert len(by_seq) == 4 * 20 * 2
    assert all(kinds == ["StageEvent", "StageEnd"] for kinds in by_seq.values())


# -- stage results, for observers that ask ------------------------------------


class WantsResult(RecordingObserver):
    wants_result = True


def ends(observer: RecordingObserver) -> list[StageEnd]:
    return [e for e in observer.events if isinstance(e, StageEnd)]


class Batch:
    """A stand-in for verl's DataProto: only its identity matters here."""


class Trainer:
    @emits_stage("actor_update")
    def update_actor(self, data: Any, *, scale: float = 1.0) -> dict[str, float]:
        return {"loss": 0.5 * scale}

    @emits_stage("compute_values")
    def values(self) -> list[float]:
        return [1.0]

    @emits_stage("critic_update")
    def fails(self, data: Any) -> None:
        raise RuntimeError("critic diverged")


def test_an_observer_that_wants_results_gets_the_return_value_and_first_argument_by_reference() -> None:
    wanting, batch = WantsResult(), Batch()
    with verl_events.install(observers=[wanting]):
        returned = Trainer().update_actor(batch, scale=2.0)
    [end] = ends(wanting)
    assert end.result is returned and returned == {"loss": 1.0}
    assert end.inputs is batch


def test_inputs_fall_back_to_the_first_keyword_argument_then_none() -> None:
    wanting, batch = WantsResult(), Batch()
    with verl_events.install(observers=[wanting]):
        Trainer().update_actor(data=batch, scale=3.0)
        Trainer().values()
    keyword, none = ends(wanting)
    assert keyword.inputs is batch and keyword.result == {"loss": 1.5}
    assert none.inputs is None and none.result == [1.0]


def test_without_an_observer_that_wants_results_nothing_is_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: Any) -> Any:
        raise AssertionError("inputs looked up although no observer wants them")

    monkeypatch.setattr("verl_events.bus.emit._first_input", never)
    plain = RecordingObserver()
    with verl_events.install(observers=[plain]):
        Trainer().update_actor(Batch())
    [end] = ends(plain)
    assert (end.result, end.inputs) == (None, None)


def test_every_receiver_of_an_end_sees_the_result_one_delivered_observer_asked_for() -> None:
    wanting, plain, batch = WantsResult(), RecordingObserver(), Batch()
    wanting.name, plain.name = "wanting", "plain"
    with capture_events() as events:
        with verl_events.install(observers=[wanting, plain]):
            returned = Trainer().update_actor(batch)
    assert ends(plain)[0].result is returned and ends(plain)[0].inputs is batch
    assert events[-1].result is returned  # type: ignore[attr-defined]


def test_an_observer_that_wants_results_of_other_stages_does_not_turn_them_on() -> None:
    wanting, plain = WantsResult(), RecordingObserver()
    wanting.name, plain.name = "wanting", "plain"
    wanting.selection = verl_events.Selection.parse(stages=["critic_update"])
    with verl_events.install(observers=[wanting, plain]):
        Trainer().update_actor(Batch())
    [end] = ends(plain)
    assert (end.result, end.inputs) == (None, None)
    assert wanting.events == []


def test_a_raising_stage_ends_with_the_error_no_result_and_its_inputs() -> None:
    wanting, batch = WantsResult(), Batch()
    with verl_events.install(observers=[wanting]):
        with pytest.raises(RuntimeError, match="critic diverged"):
            Trainer().fails(batch)
    [end] = ends(wanting)
    assert isinstance(end.error, RuntimeError)
    assert end.result is None and end.inputs is batch


def test_the_stage_context_manager_takes_inputs_and_a_handed_result() -> None:
    wanting, batch, output = WantsResult(), Batch(), {"reward": [1.0, 0.0]}
    with verl_events.install(observers=[wanting]):
        scoring = stage("compute_rm_score", step=1, inputs=batch, note="x")
        with scoring as event:
            assert scoring.set_result(output) is output
    [end] = ends(wanting)
    assert end.result is output and end.inputs is batch
    assert event is not None and dict(event.meta) == {"note": "x"}  # inputs is not meta


def test_set_result_returns_its_argument_and_keeps_nothing_when_nothing_listens() -> None:
    output = {"reward": 1.0}
    scoring = stage("compute_rm_score", inputs=Batch())
    with scoring as event:
        assert scoring.set_result(output) is output
    assert event is None


def test_a_raising_stage_block_ends_with_no_result_whatever_was_handed() -> None:
    wanting, batch = WantsResult(), Batch()
    with verl_events.install(observers=[wanting]):
        with pytest.raises(KeyError):
            scoring = stage("compute_rm_score", step=1, inputs=batch)
            with scoring:
                scoring.set_result({"reward": 1.0})
                raise KeyError("reward model")
    [end] = ends(wanting)
    assert end.result is None and end.inputs is batch and isinstance(end.error, KeyError)


def test_nested_stages_each_end_with_their_own_result() -> None:
    wanting, batch = WantsResult(), Batch()

    class Outer:
        @emits_stage("actor_update")
        def update_actor(self, data: Any) -> str:
            inner = stage("forward_backward", inputs="micro-batch")
            with inner:
                inner.set_result("grads")
            return "updated"

    with verl_events.install(observers=[wanting]):
        Outer().update_actor(batch)
    assert [(e.stage, e.result, e.inputs) for e in ends(wanting)] == [
        ("forward_backward", "grads", "micro-batch"),
        ("actor_update", "updated", batch),
    ]


def test_a_worker_class_pickled_by_value_reads_this_process_record() -> None:
    """Ray pickles a worker class defined in a function by value, with the
    globals its methods read: the record must come back as this process's one."""
    cloudpickle = pytest.importorskip("cloudpickle")
    from verl_events.events.listened import listeners

    def local_class() -> type:
        class Local:
            @emits_stage("actor_update")
            def update_actor(self, data: Any) -> Any:
                return data

        return Local

    copy = cloudpickle.loads(cloudpickle.dumps(local_class()))
    assert copy.update_actor.__globals__["_listeners"] is listeners
    recorder = RecordingObserver()
    with verl_events.install(observers=[recorder]):
        assert copy().update_actor(5) == 5
    assert [c[0] for c in recorder.calls] == ["begin", "end"]
