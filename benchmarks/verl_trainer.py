"""verl 0.9.1's real trainer: no profiler, verl's own precision_debugger, and ours.

    python benchmarks/verl_trainer.py [--rounds 2] [--steps 6]

The tiny CPU job of :mod:`verl_events.apps.verl_cpu.job` (``python -m verl.trainer.main_ppo``)
runs ``--steps`` steps in three variants, alternating, ``--rounds`` times, each a whole
run into a fresh save path:

- ``none``: no profiler;
- ``verl``: ``global_profiler.tool=precision_debugger``, msprobe statistics L1 on steps 1-2;
- ``ours``: the same settings in a ``VERL_EVENTS_CONFIG`` file (no timing observer).

Two figures per step, both from the console metrics line verl's trainer prints each step:
the whole step (``timing_s/step``) and the time of the three stages a profiler touches
(``timing_s/old_log_prob + timing_s/ref + timing_s/update_actor``, the trainer's own timers
around those worker calls).  The whole step also holds generation and reward, which neither
profiler touches and which vary by a second or more on step 1 (HF generate warming up), so
the stages are the figure that compares the profilers.  Profiled steps are 1-2, unprofiled
steps 3 onwards; nothing is skipped, so step 1 includes the trainer's warm-up in every
variant alike.  verl starts msprobe inside step 1's first dumped stage; ours imports it and
runs a warm-up session at ``import verl`` in every process, which shows in the total wall.
The last line: ``ours_vs_verl_profiled_step=<ours/verl> ours_unprofiled_vs_none=<ours/none>``,
ratios of the medians of the stages' time over all runs of a variant.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from verl_events.apps.verl_cpu.job import JobFiles, merge_overrides, prepare, run_trainer, trainer_args, trainer_env

VARIANTS = ("none", "verl", "ours")
PROFILED_STEPS = (1, 2)
STAGES = ["actor_compute_log_prob", "ref_compute_log_prob", "actor_update"]
STATS_L1 = Path(__file__).resolve().parents[1] / "observers" / "msprobe" / "configs" / "statistics_L1.json"
# verl's console logger: "step:3 - key:value - ... - timing_s/step:0.21 - ..." (a Ray prefix may precede it).
STEP_LINE = re.compile(r"\bstep:(\d+) - (.*)")
TIMER = re.compile(r"\btiming_s/([a-z_]+):([0-9.eE+-]+)")
#: The trainer's timers around the stages the profilers dump.
STAGE_TIMERS = ("old_log_prob", "ref", "update_actor")


@dataclass
class Runs:
    """One variant's runs: per step (keyed by step) the whole step's and the stages' seconds,
    wall seconds, dump counts."""

    steps: list[dict[int, float]] = field(default_factory=list)
    stages: list[dict[int, float]] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    dumps: list[int] = field(default_factory=list)

    def median(self, profiled: bool, of: str = "stages") -> float:
        runs = self.stages if of == "stages" else self.steps
        return statistics.median(t for run in runs for s, t in run.items() if (s in PROFILED_STEPS) == profiled)


def variant_setup(variant: str, save: Path) -> tuple[list[str], dict[str, str]]:
    """The overrides and extra environment of one variant writing into ``save``."""
    if variant == "verl":
        return [
            "global_profiler.tool=precision_debugger",
            f"global_profiler.steps=[{','.join(map(str, PROFILED_STEPS))}]",
            f"+global_profiler.global_tool_config.precision_debugger.config_path={STATS_L1}",
            "actor_rollout_ref.actor.profiler.enable=True",
            "actor_rollout_ref.ref.profiler.enable=True",
        ], {}
    if variant == "ours":
        config = save.with_suffix(".yaml")
        config.write_text(
            yaml.safe_dump(
                {
                    "global_profiler": {
                        "tool": "precision_debugger",
                        "steps": list(PROFILED_STEPS),
                        "save_path": str(save),
                        "global_tool_config": {"precision_debugger": {"config_path": str(STATS_L1), "stages": STAGES}},
                    },
                    "actor_rollout_ref": {
                        "actor": {"profiler": {"enable": True}},
                        "ref": {"profiler": {"enable": True}},
                    },
                }
            )
        )
        return [], {"VERL_EVENTS_CONFIG": str(config)}
    return [], {}


def run_once(
    variant: str, files: JobFiles, steps: int, save: Path
) -> tuple[dict[int, float], dict[int, float], float, int]:
    """One main_ppo run: (seconds per step, seconds of the stages per step, wall seconds,
    number of dump.json files)."""
    overrides, extra_env = variant_setup(variant, save)
    cmd = merge_overrides(trainer_args(files, steps=steps, save_path=save), overrides)
    env = trainer_env({k: v for k, v in os.environ.items() if k != "VERL_EVENTS_CONFIG"} | extra_env)
    log = save.with_suffix(".log")
    started = time.perf_counter()
    rc = run_trainer(cmd, env, log=log)
    wall = time.perf_counter() - started
    text = log.read_text(errors="replace")
    timers = {int(m[1]): {k: float(v) for k, v in TIMER.findall(m[2])} for m in STEP_LINE.finditer(text)}
    timers = {step: found for step, found in timers.items() if "step" in found}
    times = {step: found["step"] for step, found in timers.items()}
    stages = {step: sum(found.get(name, 0.0) for name in STAGE_TIMERS) for step, found in timers.items()}
    dumps = len(list(save.rglob("dump.json")))
    if rc != 0 or sorted(times) != list(range(1, steps + 1)) or (variant != "none") != (dumps > 0):
        tail = "\n".join(text.splitlines()[-40:])
        sys.exit(
            f"{variant}: main_ppo exited {rc}, step times for steps {sorted(times)} of 1..{steps}, "
            f"{dumps} dump.json files; last lines of {log}:\n{tail}"
        )
    return times, stages, wall, dumps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="steps per run (profiled: 1-2)")
    args = parser.parse_args()
    if args.steps <= max(PROFILED_STEPS):
        parser.error(f"--steps must exceed {max(PROFILED_STEPS)}, so that some steps are unprofiled")
    runs = {variant: Runs() for variant in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="verl_trainer_bench_") as scratch:
        files = prepare(Path(scratch) / "job")
        for round_index in range(1, args.rounds + 1):
            for variant in VARIANTS:
                times, stages, wall, dumps = run_once(
                    variant, files, args.steps, Path(scratch) / f"{variant}_{round_index}"
                )
                runs[variant].steps.append(times)
                runs[variant].stages.append(stages)
                runs[variant].walls.append(wall)
                runs[variant].dumps.append(dumps)
                print(
                    f"round {round_index} {variant:<4} wall {wall:5.1f} s  dumps {dumps:3d}  step s: "
                    + " ".join(f"{times[s]:.3f}" for s in sorted(times))
                    + "  stages s: "
                    + " ".join(f"{stages[s]:.3f}" for s in sorted(stages)),
                    flush=True,
                )
    if len({*runs["verl"].dumps, *runs["ours"].dumps}) != 1:
        print(f"warning: verl and ours dumped different numbers of files: {runs['verl'].dumps} {runs['ours'].dumps}")
    unprofiled = f"3-{args.steps}"
    print(
        f"\n{'variant':<8} {'stages s, 1-2':>14} {'stages s, ' + unprofiled:>14} {'step s, 1-2':>12}"
        f" {'step s, ' + unprofiled:>12} {'total wall s':>13} {'dumps/run':>10}"
    )
    for variant, r in runs.items():
        print(
            f"{variant:<8} {r.median(True):14.3f} {r.median(False):14.3f} {r.median(True, 'step'):12.3f}"
            f" {r.median(False, 'step'):12.3f} {statistics.median(r.walls):13.1f} {statistics.median(r.dumps):10.0f}"
        )
    step2 = {v: statistics.median(run[2] for run in r.stages) for v, r in runs.items()}
    print(
        f"stages of step 2 alone (past msprobe's first session): none {step2['none']:.3f} s, "
        f"verl {step2['verl']:.3f} s, ours {step2['ours']:.3f} s, ours/verl {step2['ours'] / step2['verl']:.3f}"
    )
    print(
        f"ours_vs_verl_profiled_step={runs['ours'].median(True) / runs['verl'].median(True):.3f} "
        f"ours_unprofiled_vs_none={runs['ours'].median(False) / runs['none'].median(False):.3f}"
    )


if __name__ == "__main__":
    main()
