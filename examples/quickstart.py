"""The bus in thirty lines: emit stages, write an observer, install it from config.

python examples/quickstart.py
"""

from __future__ import annotations

import verl_events
from verl_events import Observer, StageEnd, StageEvent, emits_stage, stage


class PrintingObserver(Observer):
    """Prints every stage it selects, with the body's wall time."""

    def on_stage_begin(self, event: StageEvent) -> None:
        print(f"{'  ' * event.depth}> {event.stage} (role={event.role}, step={event.step}, rank={event.rank})")

    def on_stage_end(self, event: StageEnd) -> None:
        print(f"{'  ' * event.depth}< {event.stage} took {event.elapsed_s * 1e3:.2f} ms")


class Worker:
    global_step = 0

    @emits_stage("actor_update")
    def update_actor(self) -> None:
        with stage("forward_backward"):  # nested: depth 1, parent actor_update
            sum(i * i for i in range(10_000))


config = {
    "observers": [
        {"_target_": "__main__:PrintingObserver", "steps": ["2-3"]},
    ]
}

if __name__ == "__main__":
    worker = Worker()
    with verl_events.install(config):
        for step in range(1, 5):
            worker.global_step = step
            verl_events.set_step(step)  # for stages outside the worker (forward_backward)
            worker.update_actor()
