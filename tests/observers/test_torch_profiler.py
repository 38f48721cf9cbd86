"""TorchProfilerObserver with real torch.profiler traces on CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import verl_events
from verl_events import ConfigError, stage

from .support import Small, run_model


def trace_names(path: Path) -> set[str]:
    return {event.get("name", "") for event in json.loads(path.read_text())["traceEvents"]}


def trace_events(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(path.read_text())["traceEvents"]
    return events


def traces_under(save_path: Path) -> list[Path]:
    """The trace files under save_path (beside them is the run's claim, run.json)."""
    return sorted(save_path.rglob("torch_profiler_*.json"))


def profile(tmp_path: Path, model: Small, run: range, stages: tuple[str, ...], **options: object) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "torch_profiler", **options}]}):
        for step in run:
            for name in stages:
                with stage(name, step=step, model=model):
                    run_model(model)


def test_discrete_writes_one_trace_per_stage_holding_that_stages_ops(tmp_path: Path, model: Small) -> None:
    profile(tmp_path, model, range(1, 3), ("actor_compute_log_prob", "actor_update"), steps=[1])
    traces = sorted(str(p.relative_to(tmp_path)) for p in traces_under(tmp_path))
    assert traces == [
        "step_1/actor_compute_log_prob/torch_profiler_step_1_actor_compute_log_prob_rank0.pt.trace.json",
        "step_1/actor_update/torch_profiler_step_1_actor_update_rank0.pt.trace.json",
    ]
    names = trace_names(tmp_path / traces[1])
    assert "actor_update" in names and "actor_compute_log_prob" not in names
    assert {"aten::addmm", "aten::relu"} <= names


def test_the_stage_range_encloses_its_ops(tmp_path: Path, model: Small) -> None:
    profile(tmp_path, model, range(1, 2), ("actor_update",))
    events = trace_events(traces_under(tmp_path)[0])
    [span] = [e for e in events if e.get("name") == "actor_update" and e.get("ph") == "X"]
    addmm = [e for e in events if e.get("name") == "aten::addmm"]
    assert addmm and all(span["ts"] <= e["ts"] <= span["ts"] + span["dur"] for e in addmm)


def test_continuous_writes_one_trace_across_the_selected_steps(tmp_path: Path, model: Small) -> None:
    profile(tmp_path, model, range(1, 6), ("actor_compute_log_prob", "actor_update"), discrete=False, steps=["2-3"])
    [trace] = list(traces_under(tmp_path))
    assert str(trace.relative_to(tmp_path)) == "step_2/torch_profiler_step_2-3_rank0.pt.trace.json"
    spans = [
        e
        for e in trace_events(trace)
        if e.get("name") in ("actor_update", "actor_compute_log_prob") and e.get("ph") == "X"
    ]
    assert len(spans) == 4  # two stages on each of steps 2 and 3, none from 1, 4 or 5


def test_ranks_and_repeated_stages_never_share_a_file(
    tmp_path: Path, model: Small, monkeypatch: pytest.MonkeyPatch
) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "torch_profiler"}]}):
        for rank in ("0", "1"):
            monkeypatch.setenv("RANK", rank)
            for _ in range(2):
                with stage("actor_update", step=1, model=model):
                    run_model(model)
    assert sorted(p.name for p in traces_under(tmp_path)) == [
        "torch_profiler_step_1_actor_update_rank0.pt.trace.json",
        "torch_profiler_step_1_actor_update_rank0_call1.pt.trace.json",
        "torch_profiler_step_1_actor_update_rank1.pt.trace.json",
        "torch_profiler_step_1_actor_update_rank1_call1.pt.trace.json",
    ]


def test_shapes_and_memory_contents_reach_the_trace(tmp_path: Path, model: Small) -> None:
    profile(tmp_path, model, range(1, 2), ("actor_update",), contents=["cpu", "shapes", "memory"])
    events = trace_events(traces_under(tmp_path)[0])
    addmm = next(e for e in events if e.get("name") == "aten::addmm")
    assert "Input Dims" in addmm["args"]
    assert any(e.get("name") == "[memory]" for e in events)


def test_a_nested_stage_is_not_traced_separately(
    tmp_path: Path, model: Small, caplog: pytest.LogCaptureFixture
) -> None:
    with verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "torch_profiler"}]}):
        with stage("actor_update", step=1, model=model):
            with stage("actor_compute_log_prob", step=1, model=model):
                run_model(model)
    [trace] = list(traces_under(tmp_path))
    assert trace.parent.name == "actor_update"
    assert "torch_profiler: stage 'actor_compute_log_prob' (step 1, depth 1) is not captured" in caplog.text
    assert "actor_compute_log_prob" in trace_names(trace)  # still a named range inside the outer trace


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"contents": ["gpu"]}, r"contents: 'gpu' is not allowed; allowed: cpu, cuda, memory, shapes, stack"),
        ({"contents": "cpu"}, r"contents: 'cpu' is not allowed; use a list of"),
        ({"discrete": "no"}, r"discrete: 'no' is not allowed; use true or false"),
    ],
)
def test_bad_options_are_rejected_at_install(tmp_path: Path, options: dict, pattern: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=pattern):
        verl_events.install({"save_path": str(tmp_path), "observers": [{"name": "torch_profiler", **options}]})


def test_two_torch_profilers_on_one_stage_are_rejected(tmp_path: Path) -> None:
    config = {
        "save_path": str(tmp_path),
        "observers": [
            {"name": "torch_profiler", "steps": [1, 2]},
            {"name": "torch_profiler", "discrete": False, "steps": [2, 3], "stages": ["actor_update"]},
        ],
    }
    with pytest.raises(ConfigError, match=r"observers 'torch_profiler' and 'torch_profiler#2' both need 'kineto'"):
        verl_events.install(config)


def test_traces_open_in_tensorboards_profiler_plugin(tmp_path: Path, model: Small) -> None:
    """torch-tb-profiler finds a run's traces by name (``*.pt.trace.json``) and parses them
    into its Overview, Operator and Trace views, as ``tensorboard --logdir {save_path}`` does."""
    pytest.importorskip("torch_tb_profiler")
    from torch_tb_profiler import consts
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    profile(tmp_path, model, range(1, 2), ("actor_update",))
    (trace,) = traces_under(tmp_path)
    found = consts.WORKER_PATTERN.match(trace.name)
    assert found is not None, f"the plugin does not list {trace.name}"
    worker = found.group(1)
    data = RunProfileData.parse(worker, None, str(trace), str(tmp_path / "cache"))
    run = RunGenerator(worker, None, data).generate_run_profile()
    assert {view.name for view in run.views} >= {"overall", "operator", "trace"}
    assert "aten::addmm" in {op["name"] for op in run.operation_table_by_name["data"]}
