"""The sentinel's spike rule (observers/sentinel/spike.py): unusual *and* large, in its direction,
after a warm-up counted in steps; its margins.  Values go through real stages into an installed sentinel."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

import verl_events
from verl_events.observers.sentinel import ANOMALY_LOG, SentinelObserver, SpikeMargin, SpikeRule, parse_rules


def install(save_path: Path, rules: dict[str, Any]) -> verl_events.Installation:
    return verl_events.install({"save_path": str(save_path), "observers": [{"name": "sentinel", "rules": rules}]})


def report(stage: str, step: int, **metrics: float) -> None:
    """One run of ``stage`` at ``step`` whose result is ``metrics``."""
    running = verl_events.stage(stage, step=step)
    with running:
        running.set_result(metrics)


def run(save_path: Path, rules: dict[str, Any], values: list[float], metric: str = "actor/grad_norm") -> list[Any]:
    """One value of ``metric`` per step from step 1; the anomaly lines written."""
    with install(save_path, rules):
        for step, value in enumerate(values, 1):
            report("actor_update", step, **{metric: value})
    log = save_path / ANOMALY_LOG
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_spike_true_means_the_documented_defaults() -> None:
    assert parse_rules({"m": {"spike": True}})["m"].spike == SpikeRule(
        z=6.0, ratio=2.0, warmup=4, window=50, direction="up"
    )
    # The forms that came before `ratio` still parse, with the new defaults for what they leave out.
    old = parse_rules({"m": {"spike": {"z": 6, "warmup": 5, "window": 20, "direction": "both"}}})["m"].spike
    assert old == SpikeRule(z=6.0, ratio=2.0, warmup=5, window=20, direction="both")


def test_a_spike_triggers_against_the_median_of_the_history_once_warmed_up(tmp_path: Path) -> None:
    # Steps 1-5 are the warm-up: even a wild value (step 3) does not trigger.
    [line] = run(
        tmp_path, {"actor/grad_norm": {"spike": {"warmup": 5}}}, [1.0, 2.0, 64.0, 1.0, 2.0, 2.0, 1.0, 2.0, 16.0]
    )

    # History 1, 2, 64, 1, 2, 2, 1, 2: median 2, MAD 0.5, so z = 0.6745 * 14 / 0.5 = 18.9, and 16 is x8.
    assert (line["step"], line["rule"], line["value"], line["baseline"]) == (9, "spike", 16.0, 2.0)
    assert line["detail"] == (
        "actor/grad_norm 16 is x8 the median 2 of the last 8 values, robust z 18.9 (MAD 0.5); "
        "a spike needs x2 and z above 6"
    )


def test_a_17_percent_fall_after_three_quiet_values_is_no_alarm_but_a_large_fall_is(tmp_path: Path) -> None:
    """Issue 18's false alarm: three gradient norms with a MAD of 0.3 % of their median, then -17 %.
    The old rule scored it z = 33.  Now it is x1.21 below (not x2) and z 2.3 (the noise is at least
    5 % of the median), even with both directions watched."""
    values = [1.64752, 1.65329, 1.65906, 1.36811, 0.5]
    found = run(tmp_path, {"actor/grad_norm": {"spike": {"z": 6, "warmup": 3, "direction": "both"}}}, values)

    # Step 5: 0.5 is 1/3.3 of the median 1.6504 and z = 0.6745 * 1.15 / (0.05 * 1.6504) = 9.4.
    assert [(r["step"], r["value"]) for r in found] == [(5, 0.5)]
    assert found[0]["detail"].startswith("actor/grad_norm 0.5 is 1/3.3 of the median 1.65041 of the last 4 values")


def test_an_unusual_but_small_rise_is_no_spike(tmp_path: Path) -> None:
    # A quiet metric (MAD 0.0005): x1.5 scores z = 6.7 but is not twice the median; x2.5 is.
    found = run(tmp_path, {"loss": {"spike": True}}, [1.0, 1.001, 0.999, 1.0, 1.5, 2.5], metric="loss")

    assert [(r["step"], r["value"]) for r in found] == [(6, 2.5)]


def test_the_noise_is_never_taken_as_less_than_5_percent_of_the_median(tmp_path: Path) -> None:
    # ratio 1 leaves z alone to decide.  MAD 0: the floor 0.05 makes x1.4 z = 5.4 and x1.5 z = 6.7.
    found = run(tmp_path, {"loss": {"spike": {"ratio": 1}}}, [1.0, 1.0, 1.0, 1.0, 1.4, 1.0, 1.5], metric="loss")

    assert [(r["step"], r["value"]) for r in found] == [(7, 1.5)]


def test_spike_true_watches_rises_only_and_judges_from_step_5(tmp_path: Path) -> None:
    # Step 4's x10 is in the warm-up; step 5's fall to a tenth is not watched; step 7's x10 fires.
    found = run(tmp_path, {"actor/grad_norm": {"spike": True}}, [1.0, 1.0, 1.0, 10.0, 0.1, 1.0, 10.0])

    assert [(r["step"], r["value"], r["baseline"]) for r in found] == [(7, 10.0, 1.0)]


def test_a_spike_rule_watches_only_its_direction(tmp_path: Path) -> None:
    rules = {"actor/entropy": {"spike": {"z": 4, "warmup": 3, "direction": "down"}}}
    # At step 5, x51 upwards; at step 7, 1/1152 of the median 1.125 and z = 6.1 (MAD 0.125).
    found = run(tmp_path, rules, [1.0, 1.25, 1.0, 1.25, 64.0, 1.0, 0.0009765625], metric="actor/entropy")

    assert [(r["step"], r["rule"]) for r in found] == [(7, "spike")]


def test_the_warm_up_counts_steps_however_often_a_stage_runs(tmp_path: Path) -> None:
    """train_batch runs once per mini-batch: two values a step.  Counted in values, the warm-up of
    4 would end in step 2; counted in steps, step 4's x10 is still learnt and step 5's is judged."""
    with install(tmp_path, {"actor/grad_norm": {"spike": True}}):
        for step, values in enumerate([(1.0, 1.0), (1.0, 1.0), (1.0, 10.0), (1.0, 10.0), (1.0, 10.0)], 1):
            for value in values:
                report("train_batch", step, **{"actor/grad_norm": value})

    found = [json.loads(line) for line in (tmp_path / ANOMALY_LOG).read_text().splitlines()]
    # History at step 5's x10: 1 x7, 10 x2 (steps 3 and 4): median 1.
    assert [(r["step"], r["stage"], r["value"], r["baseline"]) for r in found] == [(5, "train_batch", 10.0, 1.0)]


def test_a_negative_median_is_measured_by_its_size(tmp_path: Path) -> None:
    # Median -1: -0.1 moved up by 0.9 of its size (a spike needs 1: "x2"); 0.5 moved 1.5 of it.
    found = run(tmp_path, {"score": {"spike": True}}, [-1.0, -1.0, -1.0, -1.0, -0.1, 0.5], metric="score")

    assert [(r["step"], r["value"]) for r in found] == [(6, 0.5)]
    assert found[0]["detail"] == (
        "score 0.5 is 1.5x its size above the median -1 of the last 5 values, robust z 20.2 (MAD 0); "
        "a spike needs 1x its size and z above 6"
    )


def test_margins_give_the_largest_ratio_and_z_judged_and_are_logged_at_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="verl_events.sentinel")
    rules = {"actor/grad_norm": {"spike": True}, "actor/pg_loss": {"spike": True}}
    with install(tmp_path, rules) as installation:
        for step, value in enumerate([1.0, 1.0, 1.0, 1.0, 1.2, 0.5, 1.4], 1):
            report("actor_update", step, **{"actor/grad_norm": value})
        report("train_batch", 1, **{"actor/grad_norm": 1.0, "actor/pg_loss": 0.1})
        [sentinel] = installation.observers
        assert isinstance(sentinel, SentinelObserver)
        margins = sentinel.margins()

    assert not (tmp_path / ANOMALY_LOG).exists()
    rule = SpikeRule()
    # Step 7: history 1 x4, 1.2, 0.5: median 1, MAD 0, so z = 0.6745 * 0.4 / 0.05 = 5.4; step 6 fell.
    assert margins == [
        SpikeMargin("actor_update", "actor/grad_norm", rule, 3, pytest.approx(1.4), 7, pytest.approx(5.396), 7),
        SpikeMargin("train_batch", "actor/grad_norm", rule, 0),
        SpikeMargin("train_batch", "actor/pg_loss", rule, 0),
    ]
    lines = [r.getMessage() for r in caplog.records if r.name == "verl_events.sentinel" and r.levelno == logging.INFO]
    assert lines == [
        "sentinel: spike margin of actor/grad_norm at actor_update: 3 values judged, the largest ratio x1.4 "
        "(step 7; a spike needs x2), the largest robust z 5.4 (step 7; a spike needs more than 6), direction up",
        "sentinel: spike margin of actor/grad_norm at train_batch: no value judged yet (the warm-up is 4 steps)",
        "sentinel: spike margin of actor/pg_loss at train_batch: no value judged yet (the warm-up is 4 steps)",
    ]
