"""Helpers several test modules share (test modules import from here, never from each other)."""

from __future__ import annotations

from verl_events import Observer, StageEnd, StageEvent, stage
from verl_events._anomaly import AnomalyEvent, anomaly
from verl_events.testing import RecordingObserver


def make_event(**overrides: object) -> StageEvent:
    fields = dict(stage="actor_update", role="actor", step=1, rank=0, world_size=1)
    fields.update(overrides)
    return StageEvent(**fields)  # type: ignore[arg-type]


class Capturing(RecordingObserver):
    """A recording observer that counts as a capture tool."""

    captures = True


class Watcher(Observer):
    """Sends an anomaly at the end of the stages of ``bad_steps``."""

    sends_anomalies = True
    passive = True

    def __init__(self, bad_steps: list[int]) -> None:
        self.bad_steps = set(bad_steps)

    def on_stage_end(self, event: StageEnd) -> None:
        if event.step in self.bad_steps:
            anomaly.send(
                event.stage,
                event=AnomalyEvent(event.step, event.stage, event.rank, "loss", float("nan"), "non_finite"),
            )


def run_steps(steps: range, stages: tuple[str, ...] = ("actor_compute_log_prob", "actor_update")) -> None:
    for step in steps:
        for name in stages:
            with stage(name, step=step):
                pass
