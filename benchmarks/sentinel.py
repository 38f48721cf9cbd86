"""What the sentinel on every stage of every step costs, against the CPU demo's unprofiled step.

    .venv/bin/python benchmarks/sentinel.py            # --steps 8 --repeats 8 --clock cpu

Runs the CPU demo's training loop (``verl_events.apps.demo.run_rank``, one
process, as ``verl-events demo`` runs it) with no observers, with the
sentinel alone on every stage (rules that exercise every check: thresholds
and spikes on the demo's metrics), and, to tell the bus's share from the
sentinel's, with an observer that does nothing but ask for every stage's
result; the runs are interleaved, after one discarded warm-up run.  A step's time runs from its first stage to the next step's first stage
(the demo's progress callback), so the first step (warm-up) and the last (no
next step) of each run are left out.

torch runs on one thread, as each rank of ``verl-events demo --nproc N``
does, and ``--clock cpu`` (the default) times a step by the CPU time of the
process (``time.process_time``): on a shared machine wall time measures the
neighbours' load as much as the step, while CPU time measures only this
process's work.  ``--clock wall`` uses wall time instead; both are printed.

Prints each configuration's best and median step time and their ratios to
the unprofiled step, the sentinel's own CPU time per step (its end hook,
timed inside), and ends with::

    sentinel_vs_unprofiled_step=<best sentinel step / best unprofiled step>

Best-of, because the least-disturbed step is the stable figure; the median
is printed beside it.  The target is at most 1.02.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from verl_events import Observer, StageEnd, VerlEventsWarning
from verl_events.apps.demo import DEMO_STAGES, DemoOptions, run_rank
from verl_events.observers.sentinel import SentinelObserver
from verl_events.testing import reset

RULES = {
    "actor/grad_norm": {"above": 1e6, "spike": {"z": 6, "warmup": 3}},
    "actor/pg_loss": {"spike": True},
    "old_log_probs/mean": {"spike": {"warmup": 3}},
    "ref_log_prob/abs_max": {"above": 1e6},
    "values/mean": {"below": -1e6, "spike": {"warmup": 3}},
    "critic_update/result": {"above": 1e6},
}


class TimedSentinel(SentinelObserver):
    """The sentinel, with its end hook's CPU time added up."""

    spent = 0.0

    def on_stage_end(self, event: StageEnd) -> None:
        started = time.thread_time()
        try:
            super().on_stage_end(event)
        finally:
            TimedSentinel.spent += time.thread_time() - started


class Listening(Observer):
    """Does nothing, but asks for every stage's result as the sentinel does:
    what the bus alone costs to deliver each stage to an observer."""

    passive = True
    wants_result = True


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
CONFIGS: dict[str, list[dict[str, Any]]] = {
    "unprofiled": [],
    "listening": [{"_target_": f"{__name__}:Listening"}],
    "sentinel": [{"_target_": f"{__name__}:TimedSentinel", "rules": RULES}],
}


def run(observers: list[dict[str, Any]], steps: int) -> dict[str, list[float]]:
    """One demo run; by clock, the times of its steps 2 .. steps-1."""
    starts: dict[str, dict[int, float]] = {clock: {} for clock in CLOCKS}

    def progress(step: int, stage: str) -> None:
        if stage == DEMO_STAGES[0]:
            for clock, now in CLOCKS.items():
                starts[clock][step] = now()

    with tempfile.TemporaryDirectory() as save_path, warnings.catch_warnings():
        warnings.simplefilter("ignore", VerlEventsWarning)  # "nothing will be observed": that is the point
        run_rank(0, DemoOptions({"save_path": save_path, "observers": observers}, steps, 1, seed=0), progress)
        assert not Path(save_path, "anomalies.jsonl").exists(), "the healthy demo tripped the sentinel"
    reset()
    return {clock: [at[step + 1] - at[step] for step in range(2, steps)] for clock, at in starts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="demo steps per run (the first and last are not timed)")
    parser.add_argument("--repeats", type=int, default=8, help="runs per configuration, interleaved")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="what the last line compares")
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be at least 3: the first and last step of a run are not timed")

    import torch

    torch.set_num_threads(1)
    run([], 3)  # warm-up: torch's first passes, imports
    times: dict[str, dict[str, list[float]]] = {name: {clock: [] for clock in CLOCKS} for name in CONFIGS}
    TimedSentinel.spent = 0.0
    for _ in range(args.repeats):
        for name, observers in CONFIGS.items():
            for clock, steps in run(observers, args.steps).items():
                times[name][clock] += steps
    hook_per_step = TimedSentinel.spent / (args.repeats * args.steps)

    print(
        f"demo: {len(DEMO_STAGES)} stages a step, torch on 1 thread, "
        f"{args.repeats} runs of {args.steps} steps per configuration, interleaved"
    )
    for clock in CLOCKS:
        plain = times["unprofiled"][clock]
        print(f"{clock} time per step          best        median   (vs unprofiled: best, median)")
        for name in CONFIGS:
            mine = times[name][clock]
            print(
                f"  {name:<12} {min(mine) * 1e3:9.2f} ms  {statistics.median(mine) * 1e3:9.2f} ms"
                f"   ({min(mine) / min(plain):.4f}, {statistics.median(mine) / statistics.median(plain):.4f})"
            )
    base = min(times["unprofiled"][args.clock])
    print(f"sentinel end hooks (CPU time): {hook_per_step * 1e3:.3f} ms per step, {hook_per_step / base * 100:.2f} % of the best unprofiled step")
    print(f"sentinel_vs_unprofiled_step={min(times['sentinel'][args.clock]) / base:.4f}")


if __name__ == "__main__":
    main()
