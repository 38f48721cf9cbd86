"""verl 0.9.1's real trainer: no profiler, verl's own precision_debugger, ours, and the always-on set.

    python benchmarks/verl_trainer.py [--rounds 2] [--steps 6] [--variants none,verl,ours]
    python benchmarks/verl_trainer.py --variants none,always_on

The tiny CPU job of :mod:`verl_events.apps.verl_cpu.job` (``python -m verl.trainer.main_ppo``)
runs ``--steps`` steps in each of ``--variants``, alternating, ``--rounds`` times, each a
whole run into a fresh save path:

- ``none``: no profiler;
- ``verl``: ``global_profiler.tool=precision_debugger``, msprobe statistics L1 on steps 1-2;
- ``ours``: the same settings in a ``VERL_EVENTS_CONFIG`` file (no timing observer);
- ``always_on``: ``VERL_EVENTS_CONFIG=always_on``, the preset's name alone (timing, watchdog,
  sentinel, mismatch, memory on every stage), run from a fresh working directory, so that its
  default ``save_path`` (``outputs/profile/{run}``) lands there, as it does for a user.

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

``always_on`` is judged two ways, on steps 2 onwards (step 1 is the trainer's warm-up): the
whole step against ``none`` (the medians' ratio, which carries this machine's noise), and
the observers' own time, read back from the timing observer's log: per step, the sum of
every stage's ``hook_s`` (every observer's begin and end hooks, the timing observer's own
included, nested stages too) over verl's ``timing_s/step`` of the same step and run.  It also
counts what the run left: timing records, heartbeats, anomalies (a healthy run has none)
and mismatch lines.  Its last line: ``always_on_hooks_share=<hooks/step>
always_on_step_vs_none=<always_on/none>``.
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
from verl_events.observers.mismatch.record import mismatch_log_path
from verl_events.observers.sentinel.record import anomaly_log_path
from verl_events.observers.timing import TimingRecord, timing_log_files
from verl_events.observers.watchdog.record import heartbeat_files

VARIANTS = ("none", "verl", "ours", "always_on")
DEFAULT_VARIANTS = "none,verl,ours"
#: Variants that dump with msprobe (the others must not).
DUMPING = ("verl", "ours")
PROFILED_STEPS = (1, 2)
STAGES = ["actor_compute_log_prob", "ref_compute_log_prob", "actor_update"]
STATS_L1 = Path(__file__).resolve().parents[1] / "verl_events/observers/msprobe/configs/statistics_L1.json"
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
    # per step, (stage, observer) -> hook seconds summed over that step's records of the stage
    hooks: list[dict[int, dict[tuple[str, str], float]]] = field(default_factory=list)
    left: list[dict[str, int]] = field(default_factory=list)  # what each run wrote (always_on)

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
    if variant == "always_on":
        return [], {"VERL_EVENTS_CONFIG": "always_on"}
    return [], {}


def run_folders(workdir: Path) -> list[Path]:
    """The preset's run folders under ``workdir`` (its default save_path, outputs/profile/{run}):
    the driver's own, which stays empty, and the one verl's workers share."""
    return sorted(p for p in (workdir / "outputs" / "profile").glob("*") if p.is_dir() and not p.is_symlink())


def hook_seconds(workdir: Path) -> dict[int, dict[tuple[str, str], float]]:
    """Per step, each (stage, observer)'s hook seconds summed over the step's records of every rank."""
    per_step: dict[int, dict[tuple[str, str], float]] = {}
    for folder in run_folders(workdir):
        for log in timing_log_files(folder):
            for line in log.read_text().splitlines():
                record = TimingRecord.from_json(line)
                if record.step is None:
                    continue
                step = per_step.setdefault(record.step, {})
                for name, seconds in record.hook_s.items():
                    key = (record.stage, name)
                    step[key] = step.get(key, 0.0) + seconds
    return per_step


def what_was_left(workdir: Path) -> dict[str, int]:
    """Counts of what the always-on set wrote: timing records, heartbeats, anomalies, mismatch lines."""
    folders = run_folders(workdir)

    def lines(paths: list[Path]) -> int:
        return sum(len(path.read_text().splitlines()) for path in paths if path.is_file())

    return {
        "timing records": lines([log for f in folders for log in timing_log_files(f)]),
        "heartbeats": sum(len(heartbeat_files(f)) for f in folders),
        "anomalies": lines([anomaly_log_path(f) for f in folders]),
        "mismatch lines": lines([mismatch_log_path(f) for f in folders]),
    }


def run_once(
    variant: str, files: JobFiles, steps: int, save: Path
) -> tuple[dict[int, float], dict[int, float], float, int]:
    """One main_ppo run: (seconds per step, seconds of the stages per step, wall seconds,
    number of dump.json files)."""
    overrides, extra_env = variant_setup(variant, save)
    cmd = merge_overrides(trainer_args(files, steps=steps, save_path=save), overrides)
    env = trainer_env({k: v for k, v in os.environ.items() if k != "VERL_EVENTS_CONFIG"} | extra_env)
    log = save.with_suffix(".log")
    # The always-on set's save_path is relative (the preset's default): it lands in the working directory.
    workdir = save if variant == "always_on" else Path.cwd()
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    here = Path.cwd()
    os.chdir(workdir)  # the trainer inherits it (contextlib.chdir is Python 3.11+)
    try:
        rc = run_trainer(cmd, env, log=log)
    finally:
        os.chdir(here)
    wall = time.perf_counter() - started
    text = log.read_text(errors="replace")
    timers = {int(m[1]): {k: float(v) for k, v in TIMER.findall(m[2])} for m in STEP_LINE.finditer(text)}
    timers = {step: found for step, found in timers.items() if "step" in found}
    times = {step: found["step"] for step, found in timers.items()}
    stages = {step: sum(found.get(name, 0.0) for name in STAGE_TIMERS) for step, found in timers.items()}
    dumps = len(list(save.rglob("dump.json")))
    if rc != 0 or sorted(times) != list(range(1, steps + 1)) or (variant in DUMPING) != (dumps > 0):
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
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, of {', '.join(VARIANTS)}")
    args = parser.parse_args()
    if args.steps <= max(PROFILED_STEPS):
        parser.error(f"--steps must exceed {max(PROFILED_STEPS)}, so that some steps are unprofiled")
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not chosen or any(v not in VARIANTS for v in chosen):
        parser.error(
            f"--variants {args.variants!r} is not allowed; use a comma-separated list of {', '.join(VARIANTS)}"
        )
    runs = {variant: Runs() for variant in chosen}
    with tempfile.TemporaryDirectory(prefix="verl_trainer_bench_") as scratch:
        files = prepare(Path(scratch) / "job")
        for round_index in range(1, args.rounds + 1):
            for variant in chosen:
                save = Path(scratch) / f"{variant}_{round_index}"
                times, stages, wall, dumps = run_once(variant, files, args.steps, save)
                runs[variant].steps.append(times)
                runs[variant].stages.append(stages)
                runs[variant].walls.append(wall)
                runs[variant].dumps.append(dumps)
                if variant == "always_on":
                    runs[variant].hooks.append(hook_seconds(save))
                    runs[variant].left.append(what_was_left(save))
                print(
                    f"round {round_index} {variant:<4} wall {wall:5.1f} s  dumps {dumps:3d}  step s: "
                    + " ".join(f"{times[s]:.3f}" for s in sorted(times))
                    + "  stages s: "
                    + " ".join(f"{stages[s]:.3f}" for s in sorted(stages)),
                    flush=True,
                )
    unprofiled = f"3-{args.steps}"
    print(
        f"\n{'variant':<10} {'stages s, 1-2':>14} {'stages s, ' + unprofiled:>14} {'step s, 1-2':>12}"
        f" {'step s, ' + unprofiled:>12} {'total wall s':>13} {'dumps/run':>10}"
    )
    for variant, r in runs.items():
        print(
            f"{variant:<10} {r.median(True):14.3f} {r.median(False):14.3f} {r.median(True, 'step'):12.3f}"
            f" {r.median(False, 'step'):12.3f} {statistics.median(r.walls):13.1f} {statistics.median(r.dumps):10.0f}"
        )
    if {"none", "verl", "ours"} <= runs.keys():
        compare_profilers(runs, unprofiled)
    if {"none", "always_on"} <= runs.keys():
        judge_always_on(runs["always_on"], runs["none"], args.steps)


def compare_profilers(runs: dict[str, Runs], unprofiled: str) -> None:
    if len({*runs["verl"].dumps, *runs["ours"].dumps}) != 1:
        print(f"warning: verl and ours dumped different numbers of files: {runs['verl'].dumps} {runs['ours'].dumps}")
    step2 = {v: statistics.median(run[2] for run in r.stages) for v, r in runs.items() if v != "always_on"}
    print(
        f"stages of step 2 alone (past msprobe's first session): none {step2['none']:.3f} s, "
        f"verl {step2['verl']:.3f} s, ours {step2['ours']:.3f} s, ours/verl {step2['ours'] / step2['verl']:.3f}"
    )
    print(
        f"ours_vs_verl_profiled_step={runs['ours'].median(True) / runs['verl'].median(True):.3f} "
        f"ours_unprofiled_vs_none={runs['ours'].median(False) / runs['none'].median(False):.3f}"
    )


def judge_always_on(always_on: Runs, none: Runs, steps: int) -> None:
    """The always-on set against no observers, steps 2 onwards: the whole step, and the hooks' own share."""
    later = range(2, steps + 1)
    step_on = statistics.median(run[s] for run in always_on.steps for s in later)
    step_none = statistics.median(run[s] for run in none.steps for s in later)
    shares: list[float] = []
    totals: list[float] = []
    per_observer: dict[str, list[float]] = {}
    per_stage: dict[tuple[str, str], list[float]] = {}
    for run_steps, run_hooks in zip(always_on.steps, always_on.hooks, strict=True):
        for s in later:
            hooks = run_hooks.get(s, {})
            totals.append(sum(hooks.values()))
            shares.append(totals[-1] / run_steps[s])
            for observer in {name for _, name in hooks}:
                per_observer.setdefault(observer, []).append(sum(t for (_, n), t in hooks.items() if n == observer))
            for key, seconds in hooks.items():
                per_stage.setdefault(key, []).append(seconds)
    print(f"\nalways_on, steps 2-{steps} of {len(always_on.steps)} run(s), medians:")
    print(f"  verl's step: none {step_none:.3f} s, always_on {step_on:.3f} s, ratio {step_on / step_none:.3f}")
    print(
        f"  the observers' hooks per step: {statistics.median(totals) * 1e3:.2f} ms, "
        f"{100 * statistics.median(shares):.2f} % of the step"
    )
    for observer, values in sorted(per_observer.items()):
        print(f"    {observer:<10} {statistics.median(values) * 1e3:8.3f} ms per step")
    print("  per stage and observer, ms per step:")
    for (stage_name, observer), values in sorted(per_stage.items()):
        print(f"    {stage_name:<24} {observer:<10} {statistics.median(values) * 1e3:8.3f}")
    for index, left in enumerate(always_on.left, 1):
        print(f"  run {index} left: " + ", ".join(f"{count} {what}" for what, count in left.items()))
    print(f"always_on_hooks_share={statistics.median(shares):.4f} always_on_step_vs_none={step_on / step_none:.3f}")


if __name__ == "__main__":
    main()
