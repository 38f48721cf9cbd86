"""What the memory observer's hooks cost a stage, in each of its modes.

    python benchmarks/memory.py [--stages 20000]

Times an empty stage with nothing installed, with an observer whose hooks do nothing (the
bus's own cost of one passive observer), and with the ``memory`` observer (host and cgroup
figures; no device here) in each mode:

* ``peak: reset`` with ``forecast: false``: the hooks read ``/proc/self/status`` twice,
  reset the peak once (``clear_refs``), read the cgroup's files and append one JSON line;
* ``peak: reset`` (the default, the forecast on): the same, and the stage's inputs and
  results asked for, the step's tokens looked up;
* ``peak: sampled``: the hooks read ``/proc/self/statm`` once each and note the stage; the
  rest is the sampling thread's (its cost per sample is printed apart).

Each figure is the best of 5 rounds; ``*_hooks_us_per_stage`` is the memory observer's
less the do-nothing observer's: what its hooks add to the stage.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import verl_events
from verl_events import Observer, StageEnd, StageEvent, stage
from verl_events.observers.memory import MemoryObserver

MODES = {
    "reset, forecast off": {"forecast": False},
    "reset (the default)": {},
    "sampled every 0.05 s": {"peak": "sampled"},
}


class DoNothing(Observer):
    """A passive observer whose hooks return at once: the bus's cost of one observer."""

    passive = True

    def on_stage_begin(self, event: StageEvent) -> None:
        pass

    def on_stage_end(self, event: StageEnd) -> None:
        pass


def per_stage(stages: int) -> float:
    started = time.perf_counter()
    for step in range(stages):
        with stage("actor_update", role="actor", step=step):
            pass
    return (time.perf_counter() - started) / stages


def installed(observer: Observer, stages: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        with verl_events.install({"save_path": folder, "observers": []}, observers=[observer]):
            return min(per_stage(stages) for _ in range(5))


def sample_cost(rounds: int = 2000) -> float:
    """One sample of the sampling thread (read, reset, fold, no stage ended), in µs."""
    observer = MemoryObserver(peak="sampled")
    sampler: Any = observer._sampler
    started = time.perf_counter()
    for _ in range(rounds):
        sampler.sample()
    return (time.perf_counter() - started) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=20_000)
    args = parser.parse_args()
    bare = min(per_stage(args.stages) for _ in range(5))
    nothing = installed(DoNothing(), args.stages)
    print(f"empty stage, nothing installed:    {bare * 1e6:6.1f} µs")
    print(f"with an observer that does nothing: {nothing * 1e6:6.1f} µs")
    for name, options in MODES.items():
        watched = installed(MemoryObserver(**options), args.stages // 10)
        key = name.split()[0].rstrip(",") + ("_no_forecast" if "off" in name else "")
        print(f"memory, {name:26} {watched * 1e6:6.1f} µs")
        print(f"memory_{key}_hooks_us_per_stage={(watched - nothing) * 1e6:.1f}")
    print(f"sampling thread: {sample_cost():.1f} µs a sample, {sample_cost() / 0.05 / 1e4:.3f} % of a core at 0.05 s")


if __name__ == "__main__":
    main()
