"""What the sentinel on every stage of every step costs, against the CPU demo's unprofiled step.

    .venv/bin/python benchmarks/sentinel.py    # --steps 8 --repeats 8 --clock cpu --verl-rounds 1 --verl-steps 5

Runs the CPU demo's training loop (``verl_events.apps.demo.tiny.run_rank``, one
process, as ``verl-events demo`` runs it) with no observers, with the
sentinel alone on every stage (rules that exercise every check: thresholds
and spikes on the demo's metrics), and, to tell the bus's share from the
sentinel's, with an observer that does nothing but ask for every stage's
result; the runs are interleaved in a rotating order, after one discarded
warm-up run.  A step's time runs from its first stage to the next step's
first stage (the demo's progress callback), so the first step (warm-up) and the last (no
next step) of each run are left out.

torch runs on one thread, as each rank of ``verl-events demo --nproc N``
does, and ``--clock cpu`` (the default) times a step by the CPU time of the
process (``time.process_time``): on a shared machine wall time measures the
neighbours' load as much as the step, while CPU time measures only this
process's work.  ``--clock wall`` uses wall time instead; both are printed.

A fourth configuration, ``armed``, adds to the sentinel a capture observer
armed with ``trigger: anomaly`` on every stage (it captures nothing: the
demo is healthy), so replay's agreement runs at the end of each replayable
stage; its cost alone is timed too, in this process (one rank: no
collective) and on two gloo ranks spawned for it (one all-reduce each).

Prints each configuration's best and median step time and their ratios to
the unprofiled step, the sentinel's own CPU time per step (its end hook,
timed inside), the agreement's cost, and ends with::

    sentinel_vs_unprofiled_step=<best sentinel step / best unprofiled step> \
        armed_vs_unprofiled_step=<the same, armed> replay_agreement_us=<one rank> replay_agreement_gloo2_us=<two>

Best-of, because the least-disturbed step is the stable figure; the median
is printed beside it.  The target is at most 1.02.

Then, ``--verl-rounds`` times (default 1; 0 skips it), the tiny CPU job of
:mod:`verl_events.apps.verl_cpu.job` (verl 0.9.1's own ``main_ppo``,
``--verl-steps`` steps) runs twice, each a whole run into a fresh save path:
with no ``VERL_EVENTS_CONFIG`` (``unprofiled``) and with one that holds only
``- name: sentinel`` (default rules: NaN/inf on every metric), in an order
that alternates from round to round.  The figures are the trainer's own
per-step timers from its console metrics line (the regexes of
``benchmarks/verl_trainer.py``): the whole step (``timing_s/step``) and the
stages the sentinel watches (``old_log_prob + ref + update_actor``: verl's
timers around the worker calls its bridge turns into the stages
``actor_compute_log_prob``, ``ref_compute_log_prob`` and ``actor_update``;
generation is no such stage, so ``gen`` is left out of that sum and stays in
the whole step).  Step 1 (the trainer's warm-up) is left out; medians over
the other steps of all runs of a configuration.  Each sentinel run must leave
no ``anomalies.jsonl`` (the job is healthy: an anomaly would be a false
alarm); the script says whether one did.  The last line is then::

    sentinel_vs_unprofiled_step=<demo> sentinel_vs_unprofiled_verl_step=<median step ratio> \
        sentinel_vs_unprofiled_verl_stages=<median watched stages ratio>
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import yaml
from verl_trainer import STAGE_TIMERS, STEP_LINE, TIMER  # benchmarks/verl_trainer.py, beside this script

from verl_events import Observer, StageEnd, VerlEventsWarning
from verl_events.apps.demo.options import DemoOptions
from verl_events.apps.demo.tiny import DEMO_STAGES, run_rank
from verl_events.apps.verl_cpu.job import JobFiles, prepare, run_trainer, trainer_args, trainer_env
from verl_events.observers.sentinel import ANOMALY_LOG, SentinelObserver
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


class Armed(Observer):
    """A capture observer that captures nothing: armed, it makes replay's agreement run."""

    captures = True


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
# The sentinel with an observer armed on the demo's stages: replay's agreement then runs at the
# end of each replayable stage (nothing is captured: the demo is healthy).
ARMED = {"_target_": f"{__name__}:Armed", "trigger": "anomaly", "stages": list(DEMO_STAGES)}
CONFIGS: dict[str, list[dict[str, Any]]] = {
    "unprofiled": [],
    "listening": [{"_target_": f"{__name__}:Listening"}],
    "sentinel": [{"_target_": f"{__name__}:TimedSentinel", "rules": RULES}],
    "armed": [{"_target_": f"{__name__}:TimedSentinel", "rules": RULES}, ARMED],
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


VERL_CONFIGS = ("unprofiled", "sentinel")


def verl_run(
    sentinel: bool, files: JobFiles, steps: int, save: Path
) -> tuple[dict[int, float], dict[int, float], float, int]:
    """One ``main_ppo`` run into ``save``: per step, the whole step's seconds and the
    watched stages' seconds (steps 2 .. steps); the run's wall seconds; the number of
    lines the sentinel wrote to ``anomalies.jsonl`` (0 when it wrote none)."""
    save.mkdir()
    base = {k: v for k, v in os.environ.items() if k != "VERL_EVENTS_CONFIG"}
    if sentinel:
        config = save / "sentinel.yaml"
        config.write_text(yaml.safe_dump({"save_path": str(save / "events"), "observers": [{"name": "sentinel"}]}))
        base["VERL_EVENTS_CONFIG"] = str(config)
    log = save / "trainer.log"
    started = time.perf_counter()
    rc = run_trainer(trainer_args(files, steps=steps, save_path=save / "profile"), trainer_env(base), log=log)
    wall = time.perf_counter() - started
    text = log.read_text(errors="replace")
    timers = {int(m[1]): {k: float(v) for k, v in TIMER.findall(m[2])} for m in STEP_LINE.finditer(text)}
    timers = {step: found for step, found in timers.items() if "step" in found}
    if rc != 0 or sorted(timers) != list(range(1, steps + 1)):
        tail = "\n".join(text.splitlines()[-40:])
        sys.exit(
            f"verl {'sentinel' if sentinel else 'unprofiled'}: main_ppo exited {rc}, step timers for steps "
            f"{sorted(timers)} of 1..{steps}; last lines of {log}:\n{tail}"
        )
    anomalies = save / "events" / ANOMALY_LOG
    found = len(anomalies.read_text().splitlines()) if anomalies.exists() else 0
    kept = range(2, steps + 1)  # step 1 is the trainer's warm-up
    return (
        {step: timers[step]["step"] for step in kept},
        {step: sum(timers[step].get(name, 0.0) for name in STAGE_TIMERS) for step in kept},
        wall,
        found,
    )


def verl_rounds(rounds: int, steps: int) -> tuple[float, float]:
    """Alternating runs of the tiny verl job; prints them and a table, and returns the
    sentinel's ratios to the unprofiled run: (median whole step, median watched stages)."""
    step_times: dict[str, list[float]] = {name: [] for name in VERL_CONFIGS}
    stage_times: dict[str, list[float]] = {name: [] for name in VERL_CONFIGS}
    fired: list[int] = []
    print(
        f"\nverl 0.9.1 main_ppo, tiny CPU job: {steps} steps a run (step 1 not timed), {rounds} round(s), "
        "order alternating; the trainer's own timers"
    )
    with tempfile.TemporaryDirectory(prefix="sentinel_bench_verl_") as scratch:
        files = prepare(Path(scratch) / "job")
        for round_index in range(1, rounds + 1):
            order = VERL_CONFIGS if round_index % 2 else VERL_CONFIGS[::-1]
            for name in order:
                times, stages, wall, anomalies = verl_run(
                    name == "sentinel", files, steps, Path(scratch) / f"{name}_{round_index}"
                )
                step_times[name] += times.values()
                stage_times[name] += stages.values()
                if name == "sentinel":
                    fired.append(anomalies)
                print(
                    f"  round {round_index} {name:<10} wall {wall:5.1f} s  step s: "
                    + " ".join(f"{t:.3f}" for t in times.values())
                    + "  stages s: "
                    + " ".join(f"{t:.3f}" for t in stages.values()),
                    flush=True,
                )
    step_ratio = statistics.median(step_times["sentinel"]) / statistics.median(step_times["unprofiled"])
    stage_ratio = statistics.median(stage_times["sentinel"]) / statistics.median(stage_times["unprofiled"])
    print(f"median over steps 2-{steps}     whole step   watched stages ({' + '.join(STAGE_TIMERS)})")
    for name in VERL_CONFIGS:
        print(
            f"  {name:<12} {statistics.median(step_times[name]):9.3f} s  {statistics.median(stage_times[name]):9.3f} s"
        )
    print(f"  sentinel / unprofiled {step_ratio:9.4f}    {stage_ratio:9.4f}")
    if any(fired):
        print(f"anomalies.jsonl: the sentinel runs wrote {fired} line(s): a false alarm on a healthy job")
    else:
        print(
            f"anomalies.jsonl: none written by any of the {len(fired)} sentinel run(s): a healthy run, no false alarm"
        )
    return step_ratio, stage_ratio


AGREEMENTS = 2000


def agreement_cost() -> tuple[float, float]:
    """Microseconds per replay agreement: in one process, and on two gloo ranks."""
    from verl_events.capture.replay import ReplayPlan

    plan = ReplayPlan([], None)
    started = time.perf_counter()
    for step in range(AGREEMENTS):
        plan.agrees("actor_compute_log_prob", step)
    alone = (time.perf_counter() - started) / AGREEMENTS * 1e6
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(_agree_on_two_ranks, args=(scratch,), nprocs=2)
        gloo = max(float(Path(scratch, f"rank{rank}").read_text()) for rank in (0, 1))
    return alone, gloo


def _agree_on_two_ranks(rank: int, scratch: str) -> None:
    import socket

    import torch.distributed as dist

    from verl_events.capture.replay import ReplayPlan

    if rank == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            Path(scratch, "port").write_text(str(probe.getsockname()[1]))
    while not Path(scratch, "port").exists():
        time.sleep(0.01)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=Path(scratch, "port").read_text())
    dist.init_process_group("gloo", rank=rank, world_size=2)
    plan = ReplayPlan([], None)
    plan.agrees("actor_compute_log_prob", 0)  # the first collective sets the group up
    started = time.perf_counter()
    for step in range(1, AGREEMENTS + 1):
        plan.agrees("actor_compute_log_prob", step)
    Path(scratch, f"rank{rank}").write_text(str((time.perf_counter() - started) / AGREEMENTS * 1e6))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="demo steps per run (the first and last are not timed)")
    parser.add_argument("--repeats", type=int, default=8, help="runs per configuration, interleaved")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu", help="what the last line compares")
    parser.add_argument(
        "--verl-rounds",
        type=int,
        default=1,
        help="rounds of the tiny verl job, each run without and with the sentinel (0: skip)",
    )
    parser.add_argument("--verl-steps", type=int, default=5, help="steps per verl run (step 1 is not timed)")
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be at least 3: the first and last step of a run are not timed")
    if args.verl_rounds < 0:
        parser.error("--verl-rounds must be 0 (skip the verl job) or more")
    if args.verl_rounds and args.verl_steps < 2:
        parser.error("--verl-steps must be at least 2: step 1 of a run is not timed")

    import torch

    torch.set_num_threads(1)
    run([], 3)  # warm-up: torch's first passes, imports
    times: dict[str, dict[str, list[float]]] = {name: {clock: [] for clock in CLOCKS} for name in CONFIGS}
    spent = dict.fromkeys(CONFIGS, 0.0)
    names = list(CONFIGS)
    for repeat in range(args.repeats):
        # A different configuration goes first each repeat: no order effect.
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            TimedSentinel.spent = 0.0
            for clock, steps in run(CONFIGS[name], args.steps).items():
                times[name][clock] += steps
            spent[name] += TimedSentinel.spent
    hook_per_step = spent["sentinel"] / (args.repeats * args.steps)

    print(
        f"demo: {len(DEMO_STAGES)} stages a step, torch on 1 thread, "
        f"{args.repeats} runs of {args.steps} steps per configuration, interleaved in a rotating order"
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
    print(
        f"sentinel end hooks (CPU time): {hook_per_step * 1e3:.3f} ms per step, "
        f"{hook_per_step / base * 100:.2f} % of the best unprofiled step"
    )
    alone, gloo = agreement_cost()
    print(
        f"replay agreement at the end of a replayable stage: {alone:.2f} us with one rank (no collective), "
        f"{gloo:.1f} us with two gloo ranks (one all-reduce of one integer)"
    )
    last = f"sentinel_vs_unprofiled_step={min(times['sentinel'][args.clock]) / base:.4f}"
    last += f" armed_vs_unprofiled_step={min(times['armed'][args.clock]) / base:.4f}"
    last += f" replay_agreement_us={alone:.2f} replay_agreement_gloo2_us={gloo:.1f}"
    if args.verl_rounds:
        step_ratio, stage_ratio = verl_rounds(args.verl_rounds, args.verl_steps)
        last += (
            f" sentinel_vs_unprofiled_verl_step={step_ratio:.4f} sentinel_vs_unprofiled_verl_stages={stage_ratio:.4f}"
        )
    print(last)


if __name__ == "__main__":
    main()
