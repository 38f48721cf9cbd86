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

Two figures per mode, each the best of 5 rounds (7 for the first):
``*_hooks_us_per_stage``, the begin and end hooks called directly, as the bus calls them
(with ``peak: sampled`` the thread does not sample during the loop: its work is timed
apart); and ``*_through_bus_us``, the memory observer's stage less the do-nothing
observer's, which also carries the bus's share and this machine's noise.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import verl_events
from verl_events import Observer, StageEnd, StageEvent, stage
from verl_events import StageEvent as Event
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


def hooks(options: dict[str, Any], stages: int) -> float:
    """The begin and end hooks of one stage, called directly, in µs (best of 7)."""
    with tempfile.TemporaryDirectory() as folder:
        observer = MemoryObserver(**options, **({"interval_s": 60} if options.get("peak") == "sampled" else {}))
        observer._root = Path(folder)
        begin = Event("actor_update", "actor", 1, 0, 1, seq=1)
        end = begin.ended(0.0, None)
        best = float("inf")
        for _ in range(7):
            started = time.perf_counter()
            for _ in range(stages):
                observer.on_stage_begin(begin)
                observer.on_stage_end(end)
            best = min(best, (time.perf_counter() - started) / stages)
            if observer._sampler is not None:
                observer._sampler._ended.clear()  # the lines the thread would have written
        observer.close()
    return best * 1e6


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
        print(f"memory_{key}_hooks_us_per_stage={hooks(options, args.stages // 10):.2f}")
        print(f"memory_{key}_through_bus_us={(watched - nothing) * 1e6:.1f}")
    sampled_alone = {"peak": "sampled", "forecast": False}
    print(f"memory_sampled_no_forecast_hooks_us_per_stage={hooks(sampled_alone, args.stages // 10):.2f}")
    sample_us = sample_cost()
    print(f"sampling thread: {sample_us:.1f} µs a sample, {sample_us / 0.05 / 1e4:.3f} % of a core at 0.05 s")


if __name__ == "__main__":
    main()
