"""The dispatcher's guarantees: order, isolation, pairing, strong references, timing."""

from __future__ import annotations

import gc
import logging
import pickle
import time
from collections.abc import Container, Iterator
from typing import Any

import pytest

import verl_events
from verl_events import Observer, ObserverError, Selection, StageEnd, StageEvent, emits_stage, stage
from verl_events.bus.dispatch import Dispatcher
from verl_events.bus.stack import result_asked
from verl_events.events.listened import EVERY_STAGE, listeners
from verl_events.testing import RecordingObserver, capture_events

from .support import make_event


class Journal(Observer):
    """Writes every hook call into a shared list, to check global order."""

    def __init__(self, journal: list[str], fail_on: str | None = None, exc: BaseException | None = None) -> None:
        self.journal = journal
        self.fail_on = fail_on
        self.exc = exc or RuntimeError("observer bug")

    def on_stage_begin(self, event: StageEvent) -> None:
        self.journal.append(f"{self.name}.begin")
        if self.fail_on == "begin":
            raise self.exc

    def on_stage_end(self, event: StageEnd) -> None:
        self.journal.append(f"{self.name}.end")
        if self.fail_on == "end":
            raise self.exc


def journals(journal: list[str], *specs: tuple[str, int]) -> list[Journal]:
    made = []
    for name, priority in specs:
        obs = Journal(journal)
        obs.name, obs.priority = name, priority
        made.append(obs)
    return made


def test_begin_runs_by_priority_then_install_order_and_end_in_reverse() -> None:
    journal: list[str] = []
    with verl_events.install(observers=journals(journal, ("a", 0), ("b", 10), ("c", 0), ("d", 10))):
        with stage("actor_update", step=1):
            journal.append("body")
    assert journal == [
        "b.begin",
        "d.begin",
        "a.begin",
        "c.begin",
        "body",
        "c.end",
        "a.end",
        "d.end",
        "b.end",
    ]


def test_a_failing_observer_is_logged_and_the_others_and_the_body_still_run(caplog: pytest.LogCaptureFixture) -> None:
    journal: list[str] = []
    first, broken, last = journals(journal, ("first", 0), ("broken", 0), ("last", 0))
    broken.fail_on = "begin"
    with verl_events.install(observers=[first, broken, last]):
        with stage("actor_update", step=4):
            journal.append("body")
    assert journal == ["first.begin", "broken.begin", "last.begin", "body", "last.end", "broken.end", "first.end"]
    [record] = [r for r in caplog.records if r.name == "verl_events"]
    assert record.levelno == logging.ERROR
    assert (
        "observer 'broken' failed in on_stage_begin for stage 'actor_update' (step 4, rank 0): "
        "RuntimeError: observer bug" in record.getMessage()
    )


def test_only_the_first_failure_of_an_observer_carries_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    broken = RecordingObserver(fail_on="end")
    with verl_events.install(observers=[broken]):
        for step in (1, 2):
            with stage("actor_update", step=step):
                pass
    records = [r for r in caplog.records if r.name == "verl_events"]
    assert [r.exc_info is not None for r in records] == [True, False]
    assert records[1].getMessage().endswith("(failure 2)")


def test_every_begin_gets_one_end_when_the_body_raises_and_the_error_propagates_unchanged() -> None:
    rec = RecordingObserver()
    error = ValueError("body failed")
    calls = 0
    with verl_events.install(observers=[rec]):
        with pytest.raises(ValueError) as raised:
            with stage("critic_update", step=2):
                calls += 1
                raise error
    assert raised.value is error
    assert calls == 1
    assert rec.calls == [("begin", "critic_update", 2), ("end", "critic_update", 2)]
    end = rec.events[-1]
    assert isinstance(end, StageEnd) and end.error is error


def test_strict_mode_raises_after_owed_end_hooks_and_skips_the_body() -> None:
    journal: list[str] = []
    outer, broken, inner = journals(journal, ("outer", 2), ("broken", 1), ("inner", 0))
    broken.fail_on = "begin"
    ran = False
    with verl_events.install({"strict": True}, observers=[outer, broken, inner]):
        with pytest.raises(
            ObserverError,
            match=r"observer 'broken' failed in on_stage_begin for stage 'actor_update' \(step 1, rank 0\); "
            r"strict mode",
        ) as raised:
            with stage("actor_update", step=1):
                ran = True
    assert not ran
    assert isinstance(raised.value.__cause__, RuntimeError)
    # "inner" never began, so it is owed nothing; the others end in reverse.
    assert journal == ["outer.begin", "broken.begin", "broken.end", "outer.end"]


def test_strict_end_failure_raises_after_every_end_hook_ran() -> None:
    journal: list[str] = []
    outer, broken = journals(journal, ("outer", 1), ("broken", 0))
    broken.fail_on = "end"
    with verl_events.install({"strict": True}, observers=[outer, broken]):
        with pytest.raises(ObserverError, match="failed in on_stage_end"):
            with stage("actor_update", step=1):
                pass
    assert journal == ["outer.begin", "broken.begin", "broken.end", "outer.end"]


def test_strict_end_failure_does_not_replace_the_body_exception(caplog: pytest.LogCaptureFixture) -> None:
    broken = RecordingObserver(fail_on="end")
    with verl_events.install({"strict": True}, observers=[broken]):
        with pytest.raises(KeyError):
            with stage("actor_update", step=1):
                raise KeyError("the body's error")
    assert any("already failing" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_are_never_swallowed(interrupt: type[BaseException]) -> None:
    journal: list[str] = []
    outer, broken = journals(journal, ("outer", 1), ("broken", 0))
    broken.fail_on, broken.exc = "begin", interrupt()
    with verl_events.install(observers=[outer, broken]):
        with pytest.raises(interrupt):
            with stage("actor_update", step=1):
                journal.append("body")
    assert journal == ["outer.begin", "broken.begin", "broken.end", "outer.end"]


def test_observers_are_held_strongly() -> None:
    rec = RecordingObserver()
    installation = verl_events.install(observers=[rec])
    del rec
    gc.collect()
    with stage("actor_update", step=1):
        pass
    [observer] = installation.observers
    assert isinstance(observer, RecordingObserver) and len(observer.calls) == 2
    installation.close()


def test_hook_times_are_reported_when_a_timing_observer_is_connected() -> None:
    class Slow(Observer):
        def on_stage_begin(self, event: StageEvent) -> None:
            time.sleep(0.02)

    slow, timing = Slow(), RecordingObserver(timings=True)
    slow.name, timing.name = "slow", "timing"
    with verl_events.install(observers=[timing, slow]):
        with stage("actor_update", step=1):
            pass
    [report] = timing.reports
    assert report.observers == ("timing", "slow")
    assert report.hook_seconds["slow"] >= 0.02
    assert report.event.elapsed_s < report.hook_seconds["slow"]  # hooks are outside the body time


def test_no_hook_time_is_measured_without_a_timing_observer(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = RecordingObserver()
    dispatcher = Dispatcher([rec], strict=False)
    clock_reads = 0

    def counting_clock() -> float:
        nonlocal clock_reads
        clock_reads += 1
        return 0.0

    monkeypatch.setattr("verl_events.bus.dispatch.perf_counter", counting_clock)
    event = make_event(seq=1)
    dispatcher.on_begin("actor_update", event=event)
    dispatcher.on_end("actor_update", event=event.ended(0.1, None))
    assert clock_reads == 0 and len(rec.calls) == 2


def test_the_framework_applies_the_selection() -> None:
    rec = RecordingObserver()
    rec.selection = Selection.parse(steps=[2], stages=["actor_update"])
    with verl_events.install(observers=[rec]):
        for step in (1, 2, 3):
            for name in ("actor_update", "critic_update"):
                with stage(name, step=step):
                    pass
    assert rec.calls == [("begin", "actor_update", 2), ("end", "actor_update", 2)]


def test_stages_no_observer_selected_build_no_event() -> None:
    rec = RecordingObserver()
    rec.selection = Selection.parse(stages=["actor_update"])
    with verl_events.install(observers=[rec]):
        assert listened() == frozenset({"actor_update"})
        with stage("critic_update", step=1) as event:
            assert event is None  # nothing listened, so nothing was built


def test_plain_blinker_receivers_get_the_events_too() -> None:
    with capture_events() as events:
        with stage("ref_compute_log_prob", step=3, batch=8):
            pass
    begin, end = events
    assert (begin.stage, begin.role, begin.step, dict(begin.meta)) == ("ref_compute_log_prob", "ref", 3, {"batch": 8})
    assert isinstance(end, StageEnd) and end.seq == begin.seq


def test_an_end_without_its_begin_is_ignored() -> None:
    rec = RecordingObserver()
    dispatcher = Dispatcher([rec], strict=False)
    dispatcher.on_end("actor_update", event=make_event(seq=99).ended(0.0, None))
    assert rec.calls == []


def test_an_observer_failing_every_stage_is_switched_off_with_one_message(caplog: pytest.LogCaptureFixture) -> None:
    broken, healthy = RecordingObserver(fail_on="begin"), RecordingObserver()
    broken.name, healthy.name = "broken", "healthy"
    with verl_events.install({"max_failures": 3}, observers=[broken, healthy]):
        for step in range(1, 11):
            with stage("actor_update", step=step):
                pass
    assert len([c for c in broken.calls if c[0] == "begin"]) == 3
    assert broken.calls[-1] == ("end", "actor_update", 3)  # the ends it was owed
    assert len(healthy.calls) == 20
    messages = [r.getMessage() for r in caplog.records if r.name == "verl_events"]
    assert len(messages) == 4
    assert messages[-1].startswith("observer 'broken' failed 3 times; it is switched off for the rest of this run")


def test_max_failures_null_never_switches_off() -> None:
    broken = RecordingObserver(fail_on="end")
    with verl_events.install({"max_failures": None}, observers=[broken]):
        for step in range(1, 8):
            with stage("actor_update", step=step):
                pass
    assert len(broken.calls) == 14


def test_after_close_stages_once_selected_are_skipped_again() -> None:
    critic, actor = RecordingObserver(), RecordingObserver()
    critic.selection = Selection.parse(stages=["critic_update"])
    actor.selection = Selection.parse(stages=["actor_update"])
    with verl_events.install(observers=[critic]):
        assert "critic_update" in listened()
    with verl_events.install(observers=[actor]):
        # Something listens again, but not to critic_update: nothing is built for it.
        assert listened() == frozenset({"actor_update"})
        with stage("critic_update", step=1) as event:
            assert event is None


def test_a_stage_with_an_unknown_step_is_named_once_when_observers_select_steps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A verl process that never learns the step (no update_weights, no start_profile)
    would otherwise dump nothing, silently."""
    config = {"observers": [{"name": "recording", "steps": [1]}]}
    with verl_events.install(config):
        for _ in range(3):
            with verl_events.stage("critic_update"):
                pass
            with verl_events.stage("critic_update", step=1):
                pass
    unknown = [r.getMessage() for r in caplog.records if "unknown step" in r.getMessage()]
    assert len(unknown) == 1
    assert unknown[0].startswith(
        "stage 'critic_update' (rank 0) runs with an unknown step, so observer 'recording', which selects steps, "
        "skips it."
    )


def test_no_word_about_unknown_steps_when_no_observer_selects_steps(caplog: pytest.LogCaptureFixture) -> None:
    with verl_events.install({"observers": [{"name": "recording"}]}):
        with verl_events.stage("critic_update"):
            pass
    assert "unknown step" not in caplog.text


def test_capture_observers_are_innermost_whatever_their_priority() -> None:
    order: list[str] = []

    class Named(Observer):
        def on_stage_begin(self, event: StageEvent) -> None:
            order.append(f"{self.name} begin")

        def on_stage_end(self, event: StageEnd) -> None:
            order.append(f"{self.name} end")

    class Capture(Named):
        captures = True

    capture, low, high = Capture(), Named(), Named()
    capture.name, capture.priority = "capture", 100
    low.name, low.priority = "low", -5
    high.name, high.priority = "high", 50
    with verl_events.install(observers=[capture, low, high]):
        with stage("actor_update", step=1):
            pass
    assert order == ["high begin", "low begin", "capture begin", "capture end", "low end", "high end"]


# -- the bus's own record of listened stages ---------------------------------


class Emitter:
    @emits_stage("actor_update")
    def update_actor(self, data: Any) -> Any:
        return data


@pytest.fixture
def built_events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The stages the emit path built an event for (it builds one exactly
    when it leaves the disabled path)."""
    import verl_events.bus.emit as emit

    built: list[str] = []
    real = emit._new_event

    def counting(name: str, *args: Any) -> StageEvent:
        built.append(name)
        return real(name, *args)

    monkeypatch.setattr(emit, "_new_event", counting)
    yield built


def listened() -> Container[str]:
    """The bus's record (a function, so a type checker does not narrow it across calls)."""
    return listeners.stages


def selecting(*stages: str, name: str = "rec") -> RecordingObserver:
    observer = RecordingObserver()
    observer.name = name
    observer.selection = Selection.parse(stages=list(stages)) if stages else Selection.parse()
    return observer


def test_nothing_is_listened_before_anything_connects() -> None:
    assert listened() == frozenset()


def test_after_install_and_close_nothing_builds_events(built_events: list[str]) -> None:
    with verl_events.install(observers=[selecting("actor_update"), selecting(name="everything")]):
        assert listened() is EVERY_STAGE
        Emitter().update_actor(1)
    assert built_events == ["actor_update"]
    assert listened() == frozenset()
    assert Emitter().update_actor(2) == 2
    with stage("actor_update", step=1) as event:
        assert event is None
    assert built_events == ["actor_update"]  # the disabled path again


def test_two_dispatchers_on_one_stage_keep_it_listened_until_both_left(built_events: list[str]) -> None:
    first, second = selecting("actor_update", "critic_update"), selecting("actor_update", "compute_values")
    one, two = Dispatcher([first], strict=False), Dispatcher([second], strict=False)
    one.connect()
    two.connect()
    try:
        assert listened() == frozenset({"actor_update", "critic_update", "compute_values"})
        one.disconnect()
        assert listened() == frozenset({"actor_update", "compute_values"})
        Emitter().update_actor(1)
        assert (first.calls, second.calls) == ([], [("begin", "actor_update", None), ("end", "actor_update", None)])
    finally:
        one.disconnect()
        two.disconnect()
    assert listened() == frozenset()
    Emitter().update_actor(1)
    assert built_events == ["actor_update"]


def test_an_observer_selecting_every_stage_makes_every_stage_emit() -> None:
    everything = selecting()
    with verl_events.install(observers=[everything, selecting("actor_update", name="one")]):
        assert listened() is EVERY_STAGE
        with stage("a_stage_nobody_named", step=1) as event:
            assert event is not None
    assert everything.calls == [("begin", "a_stage_nobody_named", 1), ("end", "a_stage_nobody_named", 1)]
    assert listened() == frozenset()


def test_a_plain_receiver_for_every_stage_gets_events_and_leaves_nothing_behind() -> None:
    got: list[tuple[str, str]] = []

    def receiver(sender: str, *, event: StageEvent) -> None:
        got.append((sender, type(event).__name__))

    verl_events.stage_begin.connect(receiver)  # blinker's default: weak
    try:
        assert listened() is EVERY_STAGE
        Emitter().update_actor(1)
    finally:
        verl_events.stage_begin.disconnect(receiver)
    assert got == [("actor_update", "StageEvent")]
    assert listened() == frozenset()


def test_a_plain_receiver_for_one_sender_gets_that_stage_only(built_events: list[str]) -> None:
    got: list[str] = []

    def receiver(sender: str, *, event: StageEvent) -> None:
        got.append(f"{sender} {type(event).__name__}")

    verl_events.stage_begin.connect(receiver, sender="actor_update", weak=False)
    verl_events.stage_end.connect(receiver, sender="actor_update", weak=False)
    try:
        assert listened() == frozenset({"actor_update"})
        Emitter().update_actor(1)
        with stage("critic_update", step=1) as event:
            assert event is None
    finally:
        verl_events.stage_begin.disconnect(receiver, sender="actor_update")
        assert listened() == frozenset({"actor_update"})  # stage_end still has it
        verl_events.stage_end.disconnect(receiver)
        verl_events.stage_begin.disconnect(receiver)  # blinker keeps it in .receivers until then
    assert got == ["actor_update StageEvent", "actor_update StageEnd"]
    assert (built_events, listened()) == (["actor_update"], frozenset())


def test_a_receiver_of_stage_end_alone_gets_the_end_events() -> None:
    got: list[StageEvent] = []

    def receiver(sender: str, *, event: StageEvent) -> None:
        got.append(event)

    with verl_events.stage_end.connected_to(receiver, sender="critic_update"):
        with stage("critic_update", step=2):
            pass
    [end] = got
    assert isinstance(end, StageEnd) and end.step == 2


def test_a_dispatcher_and_a_plain_receiver_on_one_stage_are_counted_apart() -> None:
    got: list[str] = []

    def receiver(sender: str, *, event: StageEvent) -> None:
        got.append(sender)

    with verl_events.stage_begin.connected_to(receiver, sender="actor_update"):
        with verl_events.install(observers=[selecting("actor_update")]):
            pass
        assert listened() == frozenset({"actor_update"})
        Emitter().update_actor(1)
    assert got == ["actor_update"]
    assert listened() == frozenset()


def test_receivers_for_other_senders_than_stage_names_make_no_stage_emit() -> None:
    def receiver(sender: object, **kwargs: Any) -> None:
        raise AssertionError("never sent")

    with verl_events.stage_begin.connected_to(receiver, sender=3):
        assert listened() == frozenset()


def test_the_record_pickles_as_a_reference_to_this_process_record() -> None:
    assert pickle.loads(pickle.dumps(listeners)) is listeners


def test_on_begin_asks_for_the_result_only_when_a_delivered_observer_wants_it() -> None:
    class Wanting(RecordingObserver):
        wants_result = True

    wanting, plain = Wanting(), RecordingObserver()
    wanting.selection = Selection.parse(stages=["critic_update"])
    dispatcher = Dispatcher([wanting, plain], strict=False)
    begin = make_event(seq=1)
    dispatcher.on_begin("actor_update", event=begin)
    assert not result_asked(begin.seq)
    dispatcher.on_end("actor_update", event=begin.ended(0.0, None))
    critic = make_event(stage="critic_update", seq=2)
    dispatcher.on_begin("critic_update", event=critic)
    assert result_asked(critic.seq)
    dispatcher.on_end("critic_update", event=critic.ended(0.0, None))


def test_an_observer_selecting_only_ranks_the_run_lacks_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """docs/weight-sync.md's faults for rank 1 on a one-rank run never fired, silently."""
    config = {"observers": [{"name": "recording", "ranks": [1, 2]}, {"name": "recording", "ranks": [0, 1]}]}
    with verl_events.install(config):
        for step in (1, 2):
            with verl_events.stage("actor_update", step=step):
                pass
            with verl_events.stage("critic_update", step=step):
                pass
    said = [r.getMessage() for r in caplog.records if "it never runs" in r.getMessage()]
    assert said == [
        "observer 'recording' selects rank(s) 1, 2, and this run has 1 rank(s) (world size 1): it never runs. "
        "Select ranks below 1, or run with more ranks."
    ]
