"""Anomalies and hangs reach observers' on_anomaly / on_hang hooks with the stage hooks'
order, selection, isolation and strict mode; a hook name that is no hook is refused."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

import verl_events
from verl_events import (
    AnomalyEvent,
    HangEvent,
    Observer,
    ObserverError,
    ObserverSetupError,
    Selection,
    StageEnd,
    anomaly,
    hang,
)
from verl_events.config import available_observers
from verl_events.events.observer import HOOKS
from verl_events.setup.registry import check_hook_names
from verl_events.testing import RecordingObserver


def anomaly_at(step: int | None, stage: str = "actor_update", rank: int = 0) -> AnomalyEvent:
    return AnomalyEvent(step, stage, rank, "loss", 1e9, "above", 10.0)


def hang_at(step: int | None, stage: str = "actor_update", rank: int = 0) -> HangEvent:
    return HangEvent(step, stage, rank, 2.0, 1.0)


class Hearing(Observer):
    """Records what its on_anomaly / on_hang hooks hear, on which thread; may fail on one."""

    def __init__(self, heard: list[tuple[str, str, str, int | None]], fail_on: str | None = None) -> None:
        self.heard = heard
        self.fail_on = fail_on
        self.threads: list[int] = []
        self.hung = threading.Event()

    def _hear(self, hook: str, event: AnomalyEvent | HangEvent) -> None:
        self.heard.append((self.name, hook, event.stage, event.step))
        self.threads.append(threading.get_ident())
        if self.fail_on == hook:
            raise RuntimeError(f"{self.name} was told to fail in {hook}")

    def on_anomaly(self, event: AnomalyEvent) -> None:
        self._hear("on_anomaly", event)

    def on_hang(self, event: HangEvent) -> None:
        self._hear("on_hang", event)
        self.hung.set()


class Capturing(Hearing):
    captures = True


class StageFailing(Hearing):
    def on_stage_begin(self, event: verl_events.StageEvent) -> None:
        raise RuntimeError("told to fail in on_stage_begin")


class Misspelled(Observer):
    def on_anomally(self, event: AnomalyEvent) -> None:  # the hook is on_anomaly
        pass


class Helpers(Observer):
    """Names that do not follow the hook pattern are the observer's own business."""

    on_time = True  # not a method

    def _on_anomaly(self, event: AnomalyEvent) -> None:
        pass

    def notify_on_hang(self) -> None:
        pass


def named(observer: Hearing, name: str, priority: int = 0, selection: Selection | None = None) -> Hearing:
    observer.name = name
    observer.priority = priority
    if selection is not None:
        observer.selection = selection
    return observer


def install(tmp_path: Path, *observers: Observer, **config: Any) -> verl_events.Installation:
    return verl_events.install({"save_path": str(tmp_path), **config}, observers=observers)


def test_an_anomaly_sent_on_the_signal_reaches_on_anomaly_in_begin_order(tmp_path: Path) -> None:
    heard: list[tuple[str, str, str, int | None]] = []
    outside: list[AnomalyEvent] = []

    def receive(sender: str, *, event: AnomalyEvent) -> None:
        outside.append(event)

    observers = [
        named(Capturing(heard), "capture", priority=100),
        named(Hearing(heard), "low"),
        named(Hearing(heard), "high", priority=5),
    ]
    with install(tmp_path, *observers), anomaly.connected_to(receive):
        anomaly.send("actor_update", event=anomaly_at(3))
    # Capture observers come last whatever their priority, as they begin last.
    assert [name for name, *_ in heard] == ["high", "low", "capture"]
    assert outside == [anomaly_at(3)]  # the raw signal still reaches any receiver


def test_an_anomaly_sent_from_a_stage_is_heard_on_that_stage_thread(tmp_path: Path) -> None:
    heard: list[tuple[str, str, str, int | None]] = []
    hearing = named(Hearing(heard), "hearing")
    config = {"observers": [{"_target_": "tests.support:Watcher", "bad_steps": [2]}]}
    with install(tmp_path, hearing, **config):
        worker = threading.Thread(target=lambda: [_run_step(step) for step in (1, 2)])
        worker.start()
        worker.join()
    assert heard == [("hearing", "on_anomaly", "actor_update", 2)]
    assert hearing.threads == [worker.ident]


def _run_step(step: int) -> None:
    with verl_events.stage("actor_update", step=step):
        pass


class StagesOnly(Observer):
    def on_stage_end(self, event: StageEnd) -> None:
        pass


def test_observers_without_the_hooks_add_no_receiver(tmp_path: Path) -> None:
    anomalies, hangs = len(anomaly.receivers), len(hang.receivers)
    with install(tmp_path, StagesOnly()):
        assert (len(anomaly.receivers), len(hang.receivers)) == (anomalies, hangs)
    with install(tmp_path, Hearing([])):
        assert (len(anomaly.receivers), len(hang.receivers)) == (anomalies + 1, hangs + 1)
    assert (len(anomaly.receivers), len(hang.receivers)) == (anomalies, hangs)


@pytest.mark.parametrize(
    ("signal", "event", "hook"), [(anomaly, anomaly_at(3), "on_anomaly"), (hang, hang_at(3), "on_hang")]
)
def test_a_failing_hook_is_logged_and_the_others_still_hear(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, signal: Any, event: Any, hook: str
) -> None:
    heard: list[tuple[str, str, str, int | None]] = []
    observers = [named(Hearing(heard, fail_on=hook), "bad", priority=1), named(Hearing(heard), "good")]
    with install(tmp_path, *observers):
        signal.send("actor_update", event=event)  # does not raise
    assert [name for name, *_ in heard] == ["bad", "good"]
    (failure,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failure.getMessage() == (
        f"observer 'bad' failed in {hook} for stage 'actor_update' (step 3, rank 0): "
        f"RuntimeError: bad was told to fail in {hook}"
    )


@pytest.mark.parametrize(
    ("signal", "event", "hook"), [(anomaly, anomaly_at(3), "on_anomaly"), (hang, hang_at(3), "on_hang")]
)
def test_strict_raises_to_the_sender_once_every_observer_heard(
    tmp_path: Path, signal: Any, event: Any, hook: str
) -> None:
    heard: list[tuple[str, str, str, int | None]] = []
    observers = [named(Hearing(heard, fail_on=hook), "bad", priority=1), named(Hearing(heard), "good")]
    with install(tmp_path, *observers, strict=True):
        with pytest.raises(
            ObserverError,
            match=rf"observer 'bad' failed in {hook} for stage 'actor_update' \(step 3, rank 0\); "
            r"strict mode raises it to the signal's sender",
        ) as raised:
            signal.send("actor_update", event=event)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert [name for name, *_ in heard] == ["bad", "good"]


def test_anomaly_failures_count_toward_max_failures_with_stage_failures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    heard: list[tuple[str, str, str, int | None]] = []
    flaky = named(StageFailing(heard, fail_on="on_anomaly"), "flaky")
    with install(tmp_path, flaky, max_failures=2):
        _run_step(1)  # failure 1, in on_stage_begin
        anomaly.send("actor_update", event=anomaly_at(1))  # failure 2: switched off
        anomaly.send("actor_update", event=anomaly_at(2))
        hang.send("actor_update", event=hang_at(2))
    assert heard == [("flaky", "on_anomaly", "actor_update", 1)]
    assert any("observer 'flaky' failed 2 times; it is switched off" in r.getMessage() for r in caplog.records)


def test_the_selection_picks_anomalies_and_hangs_by_stage_step_and_rank(tmp_path: Path) -> None:
    heard: list[tuple[str, str, str, int | None]] = []
    picky = Selection(stages=frozenset({"actor_update"}), steps=frozenset({2, 3}), ranks=frozenset({1}))
    by_role = Selection(roles=frozenset({"critic"}))  # an anomaly or a hang names no role
    observers = [named(Hearing(heard), "picky", selection=picky), named(Hearing(heard), "by_role", selection=by_role)]
    with install(tmp_path, *observers):
        for signal, make in ((anomaly, anomaly_at), (hang, hang_at)):
            signal.send("actor_update", event=make(2, rank=1))
            signal.send("critic_update", event=make(2, "critic_update", rank=1))  # another stage
            signal.send("actor_update", event=make(4, rank=1))  # another step
            signal.send("actor_update", event=make(None, rank=1))  # an unknown step
            signal.send("actor_update", event=make(3, rank=0))  # another rank
    picked = [(hook, stage, step) for name, hook, stage, step in heard if name == "picky"]
    assert picked == [("on_anomaly", "actor_update", 2), ("on_hang", "actor_update", 2)]
    assert len([entry for entry in heard if entry[0] == "by_role"]) == 10


def test_a_failing_on_anomaly_does_not_stop_armed_capture(tmp_path: Path) -> None:
    config = {
        "observers": [
            {"_target_": "tests.support:Watcher", "bad_steps": [3]},
            {"_target_": "tests.support:Capturing", "trigger": "anomaly"},
        ]
    }
    heard: list[tuple[str, str, str, int | None]] = []
    with install(tmp_path, named(Hearing(heard, fail_on="on_anomaly"), "bad"), **config) as installation:
        for step in range(1, 6):
            _run_step(step)
    (armed,) = [o for o in installation.observers if isinstance(o, RecordingObserver)]
    assert sorted({step for hook, _, step in armed.calls if hook == "begin"}) == [4]  # type: ignore[type-var]
    assert heard == [("bad", "on_anomaly", "actor_update", 3)]


def test_a_stage_past_its_watchdog_deadline_reaches_on_hang_on_the_monitor_thread(tmp_path: Path) -> None:
    pytest.importorskip("verl_events.observers.watchdog")
    heard: list[tuple[str, str, str, int | None]] = []
    hearing = named(Hearing(heard), "hearing")
    config = {"observers": [{"name": "watchdog", "timeout_s": 0.1, "heartbeat_s": 0.05}]}
    with install(tmp_path, hearing, **config):
        with verl_events.stage("critic_update", step=5):
            # The stage stays stuck until the hang has been heard.
            assert hearing.hung.wait(timeout=60), "no hang was delivered"
    assert heard == [("hearing", "on_hang", "critic_update", 5)]
    assert hearing.threads[0] != threading.get_ident()


def test_a_misspelled_hook_is_refused_at_install(tmp_path: Path) -> None:
    allowed = ", ".join(HOOKS)
    sentence = (
        r"tests\.test_observer_signals\.Misspelled\.on_anomally is named like a hook but is not one, so it "
        rf"would never be called; the hooks are {allowed}: rename it to one of them"
    )
    with pytest.raises(ObserverSetupError, match=rf"observer 'Misspelled': {sentence}"):
        install(tmp_path, Misspelled())
    entry = {"_target_": "tests.test_observer_signals:Misspelled"}
    with pytest.raises(
        ObserverSetupError, match=rf"observers\[0\] \(tests\.test_observer_signals:Misspelled\): {sentence}"
    ):
        verl_events.install({"save_path": str(tmp_path), "observers": [entry]})
    assert verl_events.current_installation() is None


def test_a_subclass_inherits_the_refusal_and_helpers_pass(tmp_path: Path) -> None:
    class Derived(Misspelled):
        pass

    with pytest.raises(ObserverSetupError, match=r"Misspelled\.on_anomally is named like a hook"):
        install(tmp_path, Derived())
    with install(tmp_path, Helpers()) as installation:
        assert installation.observers[0].name == "Helpers"


def test_every_installed_observer_uses_only_hook_names() -> None:
    for name, entry_point in available_observers().items():
        check_hook_names(entry_point.load(), f"entry point {name!r}")  # raises on a stray on_... method


class ClockReading(Observer):
    """Reads armed capture's clock from its on_anomaly hook."""

    def __init__(self) -> None:
        self.newest: list[int | None] = []

    def on_anomaly(self, event: AnomalyEvent) -> None:
        installation = verl_events.current_installation()
        assert installation is not None and installation.clock is not None and event.step is not None
        installation.clock.advance(event.step + 1)  # the next step's boundary, on one rank
        self.newest.append(installation.clock.newest())


def test_the_trigger_clock_notes_an_anomaly_before_any_observer_hears_it(tmp_path: Path) -> None:
    config = {
        "observers": [
            {"_target_": "tests.support:Watcher", "bad_steps": []},
            {"_target_": "tests.support:Capturing", "trigger": "anomaly"},
        ]
    }
    reading = ClockReading()
    reading.priority = 100  # the first observer to hear it
    with install(tmp_path, reading, **config):
        anomaly.send("actor_update", event=anomaly_at(3))
    assert reading.newest == [3]
