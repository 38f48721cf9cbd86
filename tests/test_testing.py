"""verl_events.testing: what a user's tests get from us."""

from __future__ import annotations

import os

import pytest

import verl_events
from verl_events.layout import RUN_ID_ENV, run_id
from verl_events.testing import RecordingObserver, reset


def test_reset_leaves_the_process_as_fresh() -> None:
    verl_events.install(observers=[RecordingObserver()])
    verl_events.set_step(4)
    verl_events.add_model_paths("actor", "policy.net")
    made = run_id()
    reset()
    assert verl_events.current_installation() is None
    assert verl_events.bus.resolve.current_step() is None
    assert verl_events.bus.resolve.model_paths("actor")[0] != "policy.net"
    assert RUN_ID_ENV not in os.environ and run_id() != made


def test_reset_forgets_payload_watchers_and_warnings_and_keeps_the_record_of_blinkers_receivers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What reset missed while the state was spread over module globals: a payload watcher
    a test left, a warning remembered; and what it must keep: the record of who listens."""
    from verl_events import find_rank
    from verl_events.events.process import PROCESS

    class Watcher:
        def began(self, payload: object) -> None: ...

        def tensor(self, name: str, tensor: object) -> None: ...

        def ended(self, payload: object, complete: bool) -> None: ...

    verl_events.watch_payloads(Watcher())
    monkeypatch.setenv("RANK", "not-a-number")
    assert find_rank() == (0, 1)
    connections = dict(PROCESS.connections)
    assert PROCESS.payload_watchers and "RANK" in PROCESS.warned_env
    reset()
    assert PROCESS.payload_watchers == [] and PROCESS.warned_env == set()
    assert PROCESS.connections == connections


def test_reset_keeps_a_run_id_someone_else_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUN_ID_ENV, "from-the-launcher")
    reset()
    assert run_id() == "from-the-launcher"


def test_the_recording_observer_keeps_the_anomalies_delivered_to_it() -> None:
    from verl_events import AnomalyEvent, anomaly, stage

    recorder = RecordingObserver()
    sent = AnomalyEvent(2, "actor_update", 0, "loss", float("nan"), "non_finite")
    with verl_events.install(observers=[recorder]):
        with stage("actor_update", role="actor", step=2):
            anomaly.send("actor_update", event=sent)
    assert recorder.alerts == [sent]
    assert recorder.calls == [("begin", "actor_update", 2), ("end", "actor_update", 2)]
