"""Replay: a forward-only stage that raised an anomaly runs again, right away, for the armed
capture observers only; training keeps the stage's own result."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

import verl_events
from verl_events import VerlEventsWarning, emits_stage
from verl_events.observers.timing import TimingRecord, timing_log_path

from .support import Capturing, run_two_gloo_ranks


class Worker:
    """Stages that return their metrics; ``bad`` steps report a NaN loss."""

    def __init__(self, bad: set[int], fail_replay: bool = False) -> None:
        self.bad = bad
        self.fail_replay = fail_replay
        self.calls: list[tuple[str, int]] = []

    def _run(self, stage: str, step: int) -> dict[str, Any]:
        self.calls.append((stage, step))
        if self.fail_replay and self.calls.count((stage, step)) == 2:
            raise RuntimeError("the replay's own failure")
        # A plain mapping: the sentinel reads each number as a metric.
        return {"loss": float("nan") if step in self.bad else 1.0, "step": step, "call": len(self.calls)}

    @emits_stage("actor_compute_log_prob")
    def compute_log_prob(self, data: dict[str, Any]) -> dict[str, Any]:
        return self._run("actor_compute_log_prob", data["global_steps"])

    @emits_stage("actor_update")
    def update_actor(self, data: dict[str, Any]) -> dict[str, Any]:
        return self._run("actor_update", data["global_steps"])

    @emits_stage("score", replayable=True)
    def score(self, data: dict[str, Any]) -> dict[str, Any]:
        return self._run("score", data["global_steps"])


def config(tmp_path: Path, **top: Any) -> dict[str, Any]:
    return {
        "save_path": str(tmp_path),
        **top,
        "observers": [
            {"name": "sentinel"},
            {"_target_": "tests.support:Capturing", "trigger": "anomaly", "max_captures": 2},
            {"_target_": "verl_events.testing:RecordingObserver"},
            {"name": "timing"},
        ],
    }


def train(worker: Worker, steps: range, *stages: str) -> list[dict[str, Any]]:
    results = []
    for step in steps:
        for name in stages:
            results.append(getattr(worker, name)({"global_steps": step}))
    return results


def test_a_forward_only_stage_that_raised_an_anomaly_runs_again_for_the_armed_observer(tmp_path: Path) -> None:
    worker = Worker(bad={2})
    with verl_events.install(config(tmp_path)) as installation:
        results = train(worker, range(1, 4), "compute_log_prob")
    assert worker.calls == [("actor_compute_log_prob", s) for s in (1, 2, 2, 3)]
    # Training got the stage's own result, not the replay's.
    assert [r["call"] for r in results] == [1, 2, 4]
    (armed,) = [o for o in installation.observers if isinstance(o, Capturing)]
    assert [(e.stage, e.step, e.replay) for e in armed.events[::2]] == [
        ("actor_compute_log_prob", 2, True),  # the anomalous step itself
        ("actor_compute_log_prob", 3, False),  # the step after, as before
    ]
    # Nobody else sees the replay: not another observer, not the timing log.
    (plain,) = [o for o in installation.observers if type(o).__name__ == "RecordingObserver"]
    assert [e.replay for e in plain.events] == [False] * 6
    timing = [TimingRecord.from_json(line) for line in timing_log_path(tmp_path, 0).read_text().splitlines()]
    assert [r.step for r in timing] == [1, 2, 3]
    (verdict,) = [json.loads(line) for line in (tmp_path / "replays.jsonl").read_text().splitlines()]
    assert (verdict["step"], verdict["verdict"], verdict["again"]) == (2, "reproducible", {"loss": "nan"})


def test_no_anomaly_no_replay_and_state_changing_stages_never_replay(tmp_path: Path) -> None:
    worker = Worker(bad={2})
    with verl_events.install(config(tmp_path)):
        train(worker, range(1, 4), "update_actor")
        train(Worker(bad=set()), range(4, 6), "compute_log_prob")
    assert worker.calls == [("actor_update", s) for s in (1, 2, 3)]
    assert not (tmp_path / "replays.jsonl").exists()


def test_a_users_stage_declared_replayable_replays(tmp_path: Path) -> None:
    worker = Worker(bad={1})
    with verl_events.install(config(tmp_path)):
        train(worker, range(1, 3), "score")
    assert worker.calls == [("score", 1), ("score", 1), ("score", 2)]


def test_declaring_a_state_changing_stage_replayable_warns_naming_the_state() -> None:
    with pytest.warns(VerlEventsWarning, match=r"actor_update updates the actor's weights and optimizer state"):

        @emits_stage("actor_update", replayable=True)
        def update(data: object) -> None: ...


def test_replay_false_turns_it_off(tmp_path: Path) -> None:
    worker = Worker(bad={2})
    with verl_events.install(config(tmp_path, replay=False)):
        train(worker, range(1, 4), "compute_log_prob")
    assert worker.calls == [("actor_compute_log_prob", s) for s in (1, 2, 3)]


def test_replays_stop_when_the_armed_observers_captures_are_spent(tmp_path: Path) -> None:
    worker = Worker(bad={1, 2, 3, 4, 5})
    with verl_events.install(config(tmp_path)):
        train(worker, range(1, 6), "compute_log_prob")
    replayed = [step for step in range(1, 6) if worker.calls.count(("actor_compute_log_prob", step)) == 2]
    assert replayed == [1, 2]  # max_captures: 2


def test_a_replay_that_raises_is_logged_and_training_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker(bad={2}, fail_replay=True)
    with verl_events.install(config(tmp_path)):
        results = train(worker, range(1, 4), "compute_log_prob")
    assert [r["step"] for r in results] == [1, 2, 3]
    failed = [
        r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "replay of stage" in r.getMessage()
    ]
    assert len(failed) == 1 and "RuntimeError: the replay's own failure" in failed[0], failed


@pytest.mark.slow
def test_an_anomaly_on_one_rank_replays_on_both_ranks_through_a_collective_body(tmp_path: Path) -> None:
    """Two gloo ranks; the stage's body all-reduces (as an FSDP forward does). Only rank 1
    reports a NaN at step 2: both ranks run the replay, so neither waits alone."""
    pytest.importorskip("torch")
    result = run_two_gloo_ranks(
        tmp_path,
        f"""
            import torch
            import verl_events
            from verl_events import emits_stage

            class Worker:
                calls = []

                @emits_stage("actor_compute_log_prob")
                def compute_log_prob(self, data):
                    self.calls.append(data["global_steps"])
                    total = torch.ones(1)
                    dist.all_reduce(total)  # every rank must run this, or the other hangs
                    bad = rank == 1 and data["global_steps"] == 2
                    return {{"loss": float("nan") if bad else total.item()}}

            config = {{"save_path": {str(tmp_path)!r}, "observers": [
                {{"name": "sentinel"}},
                {{"_target_": "tests.support:Capturing", "trigger": "anomaly"}},
            ]}}
            worker = Worker()
            with verl_events.install(config) as installation:
                for step in (1, 2, 3):
                    worker.compute_log_prob({{"global_steps": step}})
            armed = [o for o in installation.observers if o.captures][0]
            seen = [(e.step, e.replay) for e in armed.events[::2]]
            with open(os.path.join({str(tmp_path)!r}, f"rank{{rank}}.json"), "w") as f:
                json.dump({{"calls": worker.calls, "seen": seen}}, f)
            dist.destroy_process_group()
        """,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        ran = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert ran == {"calls": [1, 2, 2, 3], "seen": [[2, True], [3, False]]}, (rank, ran)
    verdicts = [json.loads(line) for line in (tmp_path / "replays.jsonl").read_text().splitlines()]
    assert [(v["rank"], v["verdict"]) for v in verdicts] == [(1, "reproducible")]
