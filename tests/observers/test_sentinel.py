"""SentinelObserver: installed from config, fed by real stages that return verl DataProto results."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from verl import DataProto

import verl_events
from verl_events import AnomalyEvent, ConfigError, anomaly, emits_stage
from verl_events.apps.demo.options import DemoOptions
from verl_events.apps.demo.tiny import run_rank
from verl_events.layout import RUN_FILE, owner_of, run_id
from verl_events.observers.sentinel import ANOMALY_LOG, SentinelObserver

NAN = float("nan")


def config(save_path: Path, **options: Any) -> dict[str, Any]:
    return {"save_path": str(save_path), "observers": [{"name": "sentinel", **options}]}


def step_batch(step: int, **metrics: Any) -> DataProto:
    """The trainer's batch for one step, carrying the metrics the stage should report."""
    return DataProto.from_single_dict(data={}, meta_info={"global_steps": step, "metrics": metrics})


class Worker:
    """verl-shaped stages: the update returns its metrics in a DataProto, as verl's legacy workers do."""

    @emits_stage("actor_update")
    def update_actor(self, data: DataProto) -> DataProto:
        return DataProto.from_single_dict(data={}, meta_info={"metrics": dict(data.meta_info["metrics"])})

    @emits_stage("train_batch")
    def train_batch(self, data: DataProto) -> DataProto:
        return self.update_actor.__wrapped__(self, data)  # type: ignore[attr-defined]

    @emits_stage("actor_compute_log_prob")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"old_log_probs": data.meta_info["metrics"]["old_log_probs"]})


def records(save_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (save_path / ANOMALY_LOG).read_text().splitlines()]


def sentinel_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "verl_events.sentinel"]


@contextmanager
def anomalies_sent() -> Iterator[list[tuple[str, AnomalyEvent]]]:
    sent: list[tuple[str, AnomalyEvent]] = []

    def receive(sender: str, *, event: AnomalyEvent) -> None:
        sent.append((sender, event))

    with anomaly.connected_to(receive):
        yield sent


# -- triggers --------------------------------------------------------------------


def test_a_nan_metric_is_written_logged_and_signalled(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="verl_events.sentinel")
    worker = Worker()
    with anomalies_sent() as sent, verl_events.install(config(tmp_path)):
        worker.update_actor(step_batch(1, **{"actor/grad_norm": 2.0}))
        worker.update_actor(step_batch(2, **{"actor/grad_norm": NAN, "actor/pg_loss": 0.5}))

    [line] = records(tmp_path)
    assert line == {
        "run": run_id(),
        "time": line["time"],
        "step": 2,
        "stage": "actor_update",
        "rank": 0,
        "metric": "actor/grad_norm",
        "value": "nan",
        "rule": "non_finite",
        "baseline": None,
        "detail": "actor/grad_norm is nan",
    }
    assert isinstance(line["time"], float) and owner_of(tmp_path) == run_id()
    [(sender, event)] = sent
    assert sender == "actor_update" and (event.step, event.metric, event.rule) == (2, "actor/grad_norm", "non_finite")
    assert math.isnan(event.value)
    [message] = [r.getMessage() for r in sentinel_logs(caplog)]
    assert message == "sentinel: step 2 actor_update rank 0: actor/grad_norm is nan (rule non_finite)"


def test_thresholds_trigger_above_and_below_with_the_limit_as_baseline(tmp_path: Path) -> None:
    rules = {"actor/grad_norm": {"above": 1000}, "actor/entropy": {"below": 0.5}}
    worker = Worker()
    with verl_events.install(config(tmp_path, rules=rules)):
        worker.update_actor(step_batch(1, **{"actor/grad_norm": 1000.0, "actor/entropy": 0.5}))  # at the limits: fine
        worker.update_actor(step_batch(2, **{"actor/grad_norm": 1024.0, "actor/entropy": 0.25}))

    found = {(r["metric"], r["rule"], r["value"], r["baseline"]) for r in records(tmp_path)}
    assert found == {("actor/grad_norm", "above", 1024.0, 1000.0), ("actor/entropy", "below", 0.25, 0.5)}
    assert {r["step"] for r in records(tmp_path)} == {2}


def test_a_metric_triggers_once_per_step_however_often_its_stage_runs(tmp_path: Path) -> None:
    worker = Worker()
    with verl_events.install(config(tmp_path)):
        for step in (1, 1, 2):  # train_batch runs once per mini-batch
            worker.train_batch(step_batch(step, **{"actor/pg_loss": NAN}))

    assert [(r["step"], r["stage"], r["metric"]) for r in records(tmp_path)] == [
        (1, "train_batch", "actor/pg_loss"),
        (2, "train_batch", "actor/pg_loss"),
    ]


def test_non_finite_elements_of_a_stage_tensor_trigger(tmp_path: Path) -> None:
    old = torch.tensor([[-1.0, NAN, -2.0], [-1.0, -1.0, float("inf")]])
    worker = Worker()
    with verl_events.install(config(tmp_path)):
        worker.compute_log_prob(step_batch(3, old_log_probs=old))

    [line] = records(tmp_path)
    assert (line["metric"], line["rule"], line["value"]) == ("old_log_probs/nonfinite_count", "non_finite", 2.0)
    assert line["detail"] == "2 non-finite element(s) in old_log_probs"


def test_the_non_finite_rule_can_be_switched_off_globally_or_per_metric(tmp_path: Path) -> None:
    worker = Worker()
    options = {"non_finite": False, "rules": {"actor/kl": {"non_finite": True}}}
    with verl_events.install(config(tmp_path, **options)):
        worker.update_actor(step_batch(1, **{"actor/grad_norm": NAN, "actor/kl": NAN}))

    assert [r["metric"] for r in records(tmp_path)] == ["actor/kl"]


def test_a_stage_that_raised_is_not_read(tmp_path: Path) -> None:
    with verl_events.install(config(tmp_path)):
        with pytest.raises(RuntimeError):
            with verl_events.stage("actor_update", step=1, inputs=None):
                raise RuntimeError("boom")
    assert not (tmp_path / ANOMALY_LOG).exists()


def test_a_stage_context_hands_its_result_over_with_set_result(tmp_path: Path) -> None:
    with verl_events.install(config(tmp_path)):
        update = verl_events.stage("critic_update", step=4)
        with update:
            update.set_result({"critic/vf_loss": float("inf")})

    [line] = records(tmp_path)
    assert (line["stage"], line["metric"], line["value"]) == ("critic_update", "critic/vf_loss", "inf")


# -- the file --------------------------------------------------------------------


def test_ranks_writing_at_once_leave_whole_lines(tmp_path: Path) -> None:
    worker = Worker()
    with verl_events.install(config(tmp_path)):

        def one_thread(index: int) -> None:
            for step in range(1, 26):
                worker.update_actor(step_batch(step, **{f"thread{index}/loss": NAN, "detail": "x" * 2000}))

        threads = [threading.Thread(target=one_thread, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    lines = records(tmp_path)
    assert len(lines) == 100
    assert {(r["metric"], r["step"]) for r in lines} == {(f"thread{i}/loss", s) for i in range(4) for s in range(1, 26)}


def test_a_failing_write_is_logged_and_the_signal_still_goes_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Worker()
    with anomalies_sent() as sent, verl_events.install(config(tmp_path)):
        (tmp_path / ANOMALY_LOG).mkdir()  # the file cannot be opened for writing
        (tmp_path / RUN_FILE).write_text(json.dumps({"run_id": run_id()}))
        worker.update_actor(step_batch(1, **{"actor/grad_norm": NAN}))
        worker.update_actor(step_batch(2, **{"actor/grad_norm": 1.0}))  # training goes on

    assert [event.metric for _, event in sent] == ["actor/grad_norm"]
    [error] = [r for r in sentinel_logs(caplog) if r.levelno == logging.ERROR]
    assert error.getMessage().startswith(
        f"sentinel: could not record the anomaly (actor/grad_norm at step 1) in {tmp_path / ANOMALY_LOG}: "
        "IsADirectoryError"
    )


def test_a_save_path_holding_another_runs_anomalies_is_refused(tmp_path: Path) -> None:
    (tmp_path / ANOMALY_LOG).write_text('{"step": 1}\n')
    (tmp_path / RUN_FILE).write_text(json.dumps({"run_id": "another-run"}))

    with pytest.raises(
        ConfigError, match=r"already holds 1 anomaly record file\(s\) from another run \(run 'another-run'"
    ):
        verl_events.install(config(tmp_path))


# -- config ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"rules": {"actor/grad_norm": {"above": "big"}}},
            "option rules.actor/grad_norm.above: 'big' is not allowed; use a number",
        ),
        (  # YAML 1.1 reads 1.0e9 as text: the error says so, and how to write it
            {"rules": {"actor/grad_norm": {"above": yaml.safe_load("1.0e9")}}},
            r"option rules.actor/grad_norm.above: '1.0e9' is not allowed; use a number "
            r"\(YAML reads 1.0e9 as text: write it 1.0e\+9\)",
        ),
        (
            {"rules": {"actor/grad_norm": {"above": True}}},
            "option rules.actor/grad_norm.above: True is not allowed; use a number",
        ),
        (
            {"rules": {"actor/grad_norm": {"below": float("nan")}}},
            "option rules.actor/grad_norm.below: nan is not allowed; use a finite number",
        ),
        (
            {"rules": {"actor/grad_norm": {"abvoe": 1}}},
            "option rules.actor/grad_norm: unknown key 'abvoe'; use any of above, below, spike, non_finite",
        ),
        (
            {"rules": {"actor/grad_norm": 1000}},
            "option rules.actor/grad_norm: 1000 is not allowed; "
            "use a mapping with any of above, below, spike, non_finite",
        ),
        (
            {"rules": ["actor/grad_norm"]},
            r"option rules: \['actor/grad_norm'\] is not allowed; use a mapping of metric name to its rules",
        ),
        (
            {"rules": {"x": {"above": 1, "below": 2}}},
            r"option rules.x: above \(1\) is less than below \(2\), so every value would trigger",
        ),
        ({"rules": {"x": {"non_finite": "yes"}}}, "option rules.x.non_finite: 'yes' is not allowed; use true or false"),
        (
            {"rules": {"x": {"spike": "on"}}},
            "option rules.x.spike: 'on' is not allowed; "
            "use true, false, or a mapping with any of z, ratio, warmup, window, direction",
        ),
        ({"rules": {"x": {"spike": {"z": -1}}}}, "option rules.x.spike.z: -1.0 is not allowed; use a positive number"),
        (
            {"rules": {"x": {"spike": {"ratio": 0.5}}}},
            r"option rules.x.spike.ratio: 0.5 is not allowed; use a number of at least 1 "
            r"\(2: a spike is at least twice the median, or at most half of it downwards; 1: z alone decides\)",
        ),
        ({"rules": {"x": {"spike": {"ratio": "x2"}}}}, "option rules.x.spike.ratio: 'x2' is not allowed; use a number"),
        (
            {"rules": {"x": {"spike": {"ratio": float("inf")}}}},
            "option rules.x.spike.ratio: inf is not allowed; use a finite number",
        ),
        (
            {"rules": {"x": {"spike": {"warmup": 2}}}},
            r"option rules.x.spike.warmup: 2 is not allowed; "
            r"use an integer of at least 3 \(a median and MAD need at least 3 values\)",
        ),
        (
            {"rules": {"x": {"spike": {"warmup": 10, "window": 5}}}},
            r"option rules.x.spike: warmup \(10 steps\) is larger than window \(5 values\), so the history "
            r"would forget the first steps before the warm-up ends; use a warmup of at most the window",
        ),
        (
            {"rules": {"x": {"spike": {"direction": "sideways"}}}},
            "option rules.x.spike.direction: 'sideways' is not allowed; use one of 'up', 'down', 'both'",
        ),
        (
            {"rules": {"x": {"spike": {"zz": 1}}}},
            "option rules.x.spike: unknown key 'zz'; use any of z, ratio, warmup, window, direction",
        ),
        ({"check_names_after": 0}, "option check_names_after: 0 is not allowed; use an integer of at least 1"),
        ({"non_finite": "no"}, "option non_finite: 'no' is not allowed; use true or false"),
    ],
)
def test_bad_options_are_refused_at_install_naming_the_path(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=rf"^observers\[0\] \(sentinel\): {message}"):
        verl_events.install(config(tmp_path, **options))


def test_rules_from_yaml_keep_their_metric_names(tmp_path: Path) -> None:
    path = tmp_path / "observers.yaml"
    path.write_text(
        f"save_path: {tmp_path}\n"
        "observers:\n"
        "  - name: sentinel\n"
        "    rules:\n"
        "      actor/grad_norm: {above: 1000, spike: {z: 6, warmup: 5}}\n"
        "      actor/entropy: {below: 0.01}\n"
    )
    with verl_events.install(str(path)) as installation:
        [sentinel] = installation.dispatcher.observers
    assert isinstance(sentinel, SentinelObserver)
    assert sentinel.rules["actor/grad_norm"].above == 1000 and sentinel.rules["actor/grad_norm"].spike is not None
    assert sentinel.rules["actor/entropy"].below == 0.01


# -- rule names no stage reported -----------------------------------------------------


def test_rule_names_never_reported_are_warned_about_once_with_the_names_seen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="verl_events.sentinel")
    rules = {"actor/grad_nrom": {"above": 10}, "actor/pg_loss": {"above": 10}}
    worker = Worker()
    with verl_events.install(config(tmp_path, rules=rules)):
        for step in range(1, 6):
            worker.update_actor(step_batch(step, **{"actor/grad_norm": 1.0, "actor/pg_loss": 0.5}))

    [message] = [r.getMessage() for r in sentinel_logs(caplog)]
    assert message.startswith(
        "sentinel: rules name 'actor/grad_nrom', which no stage of this process reported in step(s) 1, 2, "
        "so it would never trigger; the metrics reported here are: actor/grad_norm, actor/pg_loss."
    )


def test_a_run_shorter_than_the_check_is_checked_at_close(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="verl_events.sentinel")
    worker = Worker()
    with verl_events.install(config(tmp_path, rules={"gap/log_prob_abs_max": {"above": 1}})):
        worker.update_actor(step_batch(1, **{"actor/grad_norm": 1.0}))

    [message] = [r.getMessage() for r in sentinel_logs(caplog)]
    assert "rules name 'gap/log_prob_abs_max', which no stage of this process reported in step(s) 1" in message


def test_no_warning_when_every_rule_name_was_reported_or_nothing_ran(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="verl_events.sentinel")
    worker = Worker()
    with verl_events.install(config(tmp_path, rules={"actor/grad_norm": {"above": 10}})):
        for step in range(1, 5):
            worker.update_actor(step_batch(step, **{"actor/grad_norm": 1.0}))
    with verl_events.install(config(tmp_path / "driver", rules={"actor/grad_norm": {"above": 10}})):
        pass  # a process that runs no stage (verl's driver) has nothing to compare with

    assert sentinel_logs(caplog) == []
    assert not (tmp_path / "driver" / RUN_FILE).exists()


# -- the CPU demo, end to end ------------------------------------------------------------


def test_the_demo_with_an_injected_nan_records_it_and_arms_a_capture(tmp_path: Path) -> None:
    """The CPU demo with a NaN put into the actor at step 2's update; torch.profiler armed on the anomaly."""
    demo_config = {
        "save_path": str(tmp_path),
        "observers": [
            {"name": "sentinel"},
            {"name": "torch_profiler", "contents": ["cpu"], "stages": ["actor_update"], "trigger": "anomaly"},
            {"_target_": "verl_events.apps.inject:WeightFault", "kind": "nan", "step": 2, "stages": ["actor_update"]},
        ],
    }
    run_rank(0, DemoOptions(demo_config, steps=4, nproc=1, seed=0))

    lines = records(tmp_path)
    first = lines[0]
    assert (first["step"], first["stage"], first["rule"]) == (2, "actor_update", "non_finite")
    assert {r["metric"] for r in lines if r["step"] == 2} >= {"actor/grad_norm", "actor/pg_loss"}
    # The weight stays broken, so every later step records anomalies too and arms the next:
    # step 3 (after step 2's) and step 4 (after step 3's), never the healthy step 1 or 2.
    captured = {p.parent.parent.name for p in tmp_path.glob("step_*/actor_update/torch_profiler_*.json")}
    assert captured == {"step_3", "step_4"}
