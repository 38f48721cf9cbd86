"""Helpers for testing code that emits stages and observers that receive them.

::

    from verl_events.testing import capture_events

    with capture_events() as events:
        worker.update_actor(batch)
    assert [e.stage for e in events] == ["actor_update", "actor_update"]

    # or, to test your own observer's selection and pairing:
    recorder = RecordingObserver()
    with verl_events.install(observers=[recorder]):
        ...
    assert recorder.calls == [("begin", "actor_update", 1), ("end", "actor_update", 1)]
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from verl_events.events.anomaly import AnomalyEvent
from verl_events.events.hang import HangEvent
from verl_events.events.observer import Observer
from verl_events.events.process import PROCESS
from verl_events.events.signals import stage_begin, stage_end
from verl_events.events.stages import StageEnd, StageEvent, StageReport

__all__ = ["RecordingObserver", "capture_events", "reset"]


def reset() -> None:
    """Put verl_events back as a fresh process has it: no installation, no
    announced step, no added model paths, no payload watcher, no warnings
    remembered, and no run id made up by this process (so the next run here
    gets a new one).  For test fixtures; the verl bridge is left as it is
    (see :meth:`~verl_events.events.process.ProcessState.reset`)."""
    PROCESS.reset()


@contextmanager
def capture_events() -> Iterator[list[StageEvent]]:
    """Yield a list that fills with every begin and end event sent while the
    block runs, in send order (end events are :class:`StageEnd`).

    It subscribes a plain blinker receiver for all stages, so stages are
    emitted even when no observer is installed.
    """
    events: list[StageEvent] = []
    lock = threading.Lock()

    def record(sender: str, *, event: StageEvent) -> None:
        with lock:
            events.append(event)

    with ExitStack() as stack:
        stack.enter_context(stage_begin.connected_to(record))
        stack.enter_context(stage_end.connected_to(record))
        yield events


class RecordingObserver(Observer):
    """An observer that remembers what it received.

    ``calls`` holds ``(hook, stage, step)`` tuples in call order, ``events``
    the events themselves, ``reports`` the timing reports when
    ``wants_timings`` is True (pass ``timings=True``), and ``alerts`` the
    anomalies and hangs delivered to it (``on_anomaly``, ``on_hang``), in order.  Registered as the
    entry point ``recording``, so a config can use it to check a selection.
    """

    def __init__(self, timings: bool = False, fail_on: str | None = None) -> None:
        self.calls: list[tuple[str, str, int | None]] = []
        self.events: list[StageEvent] = []
        self.reports: list[StageReport] = []
        self.alerts: list[AnomalyEvent | HangEvent] = []
        self.closed = False
        self.fail_on = fail_on
        self.wants_timings = timings
        self._lock = threading.Lock()

    def _record(self, hook: str, event: StageEvent) -> None:
        with self._lock:
            self.calls.append((hook, event.stage, event.step))
            self.events.append(event)
        if self.fail_on == hook:
            raise RuntimeError(f"{self.name} was told to fail on {hook}")

    def on_stage_begin(self, event: StageEvent) -> None:
        self._record("begin", event)

    def on_stage_end(self, event: StageEnd) -> None:
        self._record("end", event)

    def on_stage_report(self, report: StageReport) -> None:
        with self._lock:
            self.reports.append(report)

    def on_anomaly(self, event: AnomalyEvent) -> None:
        with self._lock:
            self.alerts.append(event)

    def on_hang(self, event: HangEvent) -> None:
        with self._lock:
            self.alerts.append(event)

    def close(self) -> None:
        self.closed = True
