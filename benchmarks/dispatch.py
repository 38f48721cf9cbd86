"""Cost of emitting a stage when nothing (or nothing relevant) listens.

    python benchmarks/dispatch.py

Prints ns per call for
  (a) a bare method,
  (b) the same method under @emits_stage with nothing installed,
  (c) the same with 10 observers installed, none selecting this stage,
  (d) verl's own @DistProfiler.annotate with profiling disabled (when verl is installed),
and ends with one line ``disabled_overhead_ns=<b-a> filtered_overhead_ns=<c-a>
verl_annotate_overhead_ns=<d-a>``.  Each figure is the best of several
repeats (the least-disturbed run), so the differences are stable to a few ns.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

import verl_events
from verl_events import Observer, Selection, emits_stage


class Bare:
    def update_actor(self, data: Any) -> Any:
        return data


class Emitting:
    @emits_stage("actor_update")
    def update_actor(self, data: Any) -> Any:
        return data


def ns_per_call(call: Callable[[], Any], number: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e9


def verl_annotated() -> Callable[[], Any] | None:
    try:
        from verl.utils.profiler import DistProfiler, DistProfilerExtension
    except ImportError:
        return None

    class VerlWorker(DistProfilerExtension):  # type: ignore[misc]
        def __init__(self) -> None:
            DistProfilerExtension.__init__(self, DistProfiler(rank=0, config=None))

        @DistProfiler.annotate(color="red", role="actor_update")
        def update_actor(self, data: Any) -> Any:
            return data

    worker = VerlWorker()
    return lambda: worker.update_actor(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=200_000, help="calls per repeat")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    bare, emitting = Bare(), Emitting()

    a = ns_per_call(lambda: bare.update_actor(1), args.number, args.repeat)
    b = ns_per_call(lambda: emitting.update_actor(1), args.number, args.repeat)

    others = [name for name in verl_events.STAGE_ROLES if name != "actor_update"]
    observers = []
    for i in range(10):
        observer = Observer()
        observer.name = f"observer{i}"
        observer.selection = Selection.parse(stages=[others[i % len(others)]])
        observers.append(observer)
    with verl_events.install(observers=observers):
        c = ns_per_call(lambda: emitting.update_actor(1), args.number, args.repeat)

    verl_call = verl_annotated()
    d = ns_per_call(verl_call, args.number, args.repeat) if verl_call else float("nan")

    print(f"(a) bare method                          {a:8.1f} ns/call")
    print(f"(b) @emits_stage, nothing installed      {b:8.1f} ns/call")
    print(f"(c) @emits_stage, 10 observers, none sel {c:8.1f} ns/call")
    print(f"(d) verl DistProfiler.annotate, disabled {d:8.1f} ns/call" + ("" if verl_call else "  (verl not installed)"))
    ratio = (d - a) / (b - a) if verl_call and b > a else float("nan")
    print(f"verl's disabled overhead / ours: {ratio:.1f}x")
    print(f"disabled_overhead_ns={b - a:.0f} filtered_overhead_ns={c - a:.0f} verl_annotate_overhead_ns={d - a:.0f}")


if __name__ == "__main__":
    main()
