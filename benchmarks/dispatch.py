"""Cost of emitting a stage when nothing (or nothing relevant) listens.

    python benchmarks/dispatch.py

Prints ns per call for
  (a) a bare method,
  (b) the same method under @emits_stage with nothing installed,
  (c) the same with 10 observers installed, none selecting this stage,
  (d) verl's own @DistProfiler.annotate with profiling disabled (when verl is installed),
  (e) the same method with one no-op observer selecting the stage,
  (f) the same as (e), the observer setting ``wants_result``,
then whether b-a and c-a meet their target (each at most 100 ns over the bare
call), and ends with one line ``disabled_overhead_ns=<b-a>
filtered_overhead_ns=<c-a> verl_annotate_overhead_ns=<d-a>
result_overhead_ns=<f-e>``.  Each figure is the best of many short repeats
(the least-disturbed one), and the cases take turns within each repeat, so
b-a and c-a are stable to a few ns even on a shared, busy machine.  (e) and
(f) cost ~100x more per call and run a hundredth of the calls: f-e is stable
to a few hundred ns only, a sanity check (results cost references, not
copies) rather than a measurement.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import verl_events
from verl_events import Observer, Selection, emits_stage

TARGET_NS = 100  # b-a and c-a: the emit path's cost where nothing listens


class WantsResult(Observer):
    wants_result = True


class Bare:
    def update_actor(self, data: Any) -> Any:
        return data


class Emitting:
    @emits_stage("actor_update")
    def update_actor(self, data: Any) -> Any:
        return data


def best_ns_per_call(
    cases: dict[str, tuple[Callable[[], Any], Callable[[], AbstractContextManager[Any]], int]], repeat: int
) -> dict[str, float]:
    """Best ns per call of each case.  The cases take turns within each
    repeat, so a load that comes and goes on a shared machine disturbs them
    alike and the differences stay meaningful."""
    best = {label: float("inf") for label in cases}
    for _ in range(repeat):
        for label, (call, setting, number) in cases.items():
            with setting():
                best[label] = min(best[label], timeit.timeit(call, number=number) / number * 1e9)
    return best


def verl_annotated() -> Callable[[], Any] | None:
    try:
        from verl.utils.profiler import DistProfiler, DistProfilerExtension
    except ImportError:
        return None

    class VerlWorker(DistProfilerExtension):
        def __init__(self) -> None:
            DistProfilerExtension.__init__(self, DistProfiler(rank=0, config=None))

        @DistProfiler.annotate(color="red", role="actor_update")
        def update_actor(self, data: Any) -> Any:
            return data

    worker = VerlWorker()
    return lambda: worker.update_actor(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=50_000, help="calls per repeat")
    parser.add_argument("--repeat", type=int, default=25)
    args = parser.parse_args()
    bare, emitting = Bare(), Emitting()
    others = [name for name in verl_events.STAGE_ROLES if name != "actor_update"]

    def ten_elsewhere() -> verl_events.Installation:
        observers = []
        for i in range(10):
            observer = Observer()
            observer.name = f"observer{i}"
            observer.selection = Selection.parse(stages=[others[i % len(others)]])
            observers.append(observer)
        return verl_events.install(observers=observers)

    def one(observer: Observer) -> Callable[[], verl_events.Installation]:
        observer.name = type(observer).__name__
        return lambda: verl_events.install(observers=[observer])

    emit, n = (lambda: emitting.update_actor(1)), args.number
    cases = {
        "a": (lambda: bare.update_actor(1), nullcontext, n),
        "b": (emit, nullcontext, n),
        "c": (emit, ten_elsewhere, n),
        # The listened path costs ~100x more per call: a hundredth of the calls.
        "e": (emit, one(Observer()), max(n // 100, 1)),
        "f": (emit, one(WantsResult()), max(n // 100, 1)),
    }
    verl_call = verl_annotated()
    if verl_call is not None:
        cases["d"] = (verl_call, nullcontext, n)
    best = best_ns_per_call(cases, args.repeat)
    a, b, c, e, f = (best[label] for label in "abcef")
    d = best.get("d", float("nan"))

    print(f"(a) bare method                          {a:8.1f} ns/call")
    print(f"(b) @emits_stage, nothing installed      {b:8.1f} ns/call")
    print(f"(c) @emits_stage, 10 observers, none sel {c:8.1f} ns/call")
    print(
        f"(d) verl DistProfiler.annotate, disabled {d:8.1f} ns/call" + ("" if verl_call else "  (verl not installed)")
    )
    print(f"(e) @emits_stage, 1 no-op observer       {e:8.1f} ns/call")
    print(f"(f) the same, wants_result               {f:8.1f} ns/call")
    ratio = (d - a) / (b - a) if verl_call and b > a else float("nan")
    print(f"verl's disabled overhead / ours: {ratio:.1f}x")
    for label, overhead in (("b-a (disabled)", b - a), ("c-a (filtered)", c - a)):
        print(f"target {label} <= {TARGET_NS} ns: {'met' if overhead <= TARGET_NS else 'MISSED'} ({overhead:.0f} ns)")
    print(
        f"disabled_overhead_ns={b - a:.0f} filtered_overhead_ns={c - a:.0f} "
        f"verl_annotate_overhead_ns={d - a:.0f} result_overhead_ns={f - e:.0f}"
    )


if __name__ == "__main__":
    main()
