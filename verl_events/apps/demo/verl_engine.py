"""``verl-events demo --engine verl``: verl 0.9.1's real PPO trainer on CPU, observed.

Runs ``python -m verl.trainer.main_ppo`` on the tiny offline job of
:mod:`verl_events.apps.verl_cpu.job` (a random 2-layer Qwen2 model, FSDP2 on gloo,
a local Ray cluster) with three tools stacked: msprobe statistics at L1 on
steps 1-2 for the actor and ref stages, torch.profiler (CPU) on step 2's
``actor_update``, and timing on every stage.  The observers reach every
process verl starts the way they would in a real job: our verl plugin reads
``$VERL_EVENTS_CONFIG``, which points at ``{save_path}/observers.yaml``, a copy
of the config with absolute paths.  Afterwards it prints the same overhead
table and dump count as the fast demo (:func:`verl_events.apps.demo.tiny.print_summary`).

The job's model, tokenizer and data are built once, under ``outputs/verl-job``
of the working directory, and reused.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from verl_events import STAGE_ROLES, ConfigError, ObserverSetupError
from verl_events.config import (
    build_observers,
    from_verl_config,
    is_bare_name,
    is_verl_config,
    load_config,
    read_config,
    start_run_folder,
)
from verl_events.layout import DRIVER_LOG

from ..verl_cpu.engine_options import with_rollout_engines
from ..verl_cpu.trainer_log import finished_step, tail
from .summary import has_msprobe, print_summary, shown

__all__ = ["DEFAULT_STEPS", "JOB_DIR", "command", "default_config", "missing_modules", "prepare_config", "run"]

DEFAULT_STEPS = 3
JOB_DIR = Path("outputs/verl-job")
CONFIG_FILE = "observers.yaml"
#: verl's trainer output, beside what the observers write (where diagnose and gather look).
TRAINER_LOG = DRIVER_LOG
#: How much of the trainer's output a failed run shows.
LOG_TAIL_LINES = 40
#: What the trainer imports on CPU: verl, and what verl's rollout server imports undeclared.
REQUIRED_MODULES = ("torch", "verl", "ray", "cachetools", "uvicorn", "fastapi")
# Not on PyPI: the extra is installed from a clone of this repository.
_INSTALL_HINT = "install the verl-cpu extra from a clone of verl-events: pip install '.[verl-cpu]' in the clone"


def default_config(save_path: str) -> dict[str, Any]:
    """The fast demo's observers (timing on every stage; msprobe statistics L1 on
    steps 1-2 for the actor and ref stages) plus torch.profiler, CPU only, on
    step 2's actor_update.  Also in ``examples/verl_demo.yaml``."""
    from .options import default_config as fast_demo_config

    config = fast_demo_config(save_path)
    config["observers"].append(
        {"name": "torch_profiler", "steps": [2], "stages": ["actor_update"], "contents": ["cpu"]}
    )
    return config


def missing_modules() -> list[str]:
    """The modules of the ``verl-cpu`` extra that cannot be imported here."""
    return [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]


def _unsupported(args: argparse.Namespace) -> tuple[str, str] | None:
    """The first fast-demo option given that the verl engine cannot honour, and why."""
    if args.nproc != 1:
        return f"--nproc {args.nproc}", "the job runs on one rank"
    if args.perturb:
        return "--perturb", "it changes the tiny engine's model, not verl's"
    if args.seed is not None:
        return "--seed", "the job seeds itself, see verl_events.apps.verl_cpu.job"
    if args.inject is not None:
        return (
            "--inject",
            "it changes the tiny engine's model; under verl add a WeightFault observer, see docs/sentinel.md",
        )
    return None


def _absolute_paths(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (our form) with ``save_path`` and each observer's ``config_path``
    absolute, so that every process reads the same files whatever its cwd."""
    result = dict(config, save_path=str(Path(config["save_path"]).resolve()))
    observers = []
    for entry in result.get("observers") or []:
        path = entry.get("config_path") if isinstance(entry, dict) else None
        if isinstance(path, str) and not is_bare_name(path):  # a path, not a packaged config's name
            entry = dict(entry, config_path=str(Path(path).resolve()))
        observers.append(entry)
    result["observers"] = observers
    return result


def prepare_config(config_file: str | None, save_path: str | None) -> tuple[dict[str, Any], Path | None]:
    """The observers config to run: ``config_file`` (our form or verl's) or the
    default, with the save path (``save_path``, the file's, or a fresh
    ``outputs/verl-demo/{run}``, filled in here) and other paths absolute, and the mismatch
    and weight_sync observers pointed at the job's rollout server where the config names no
    engine of theirs; and the ``latest`` link to point at it (when the save path ended in
    ``{run}``), else None.  Validated; raises :class:`ConfigError`."""
    raw = read_config(config_file) if config_file else None
    if raw is not None and is_verl_config(raw):
        raw = from_verl_config(raw)
    chosen = save_path or (raw or {}).get("save_path") or "outputs/verl-demo/{run}"
    # The observers that ask the rollout engine (mismatch, weight_sync) ask this job's server.
    config = with_rollout_engines(raw if raw is not None else default_config(str(chosen)))
    config["save_path"] = str(chosen)
    # {run} is filled in here, once, with this process's run id: verl's processes
    # share Ray's, which does not exist yet, and this process needs the folder first.
    # The link therefore cannot come from them either: run() makes it (start_run_folder).
    filled = load_config(config)
    config["save_path"] = str(filled.save_path)
    config = _absolute_paths(config)
    load_config(config)
    return config, None if filled.latest is None else filled.latest.absolute()


def run(config: dict[str, Any], steps: int, job_dir: Path = JOB_DIR, latest: Path | None = None) -> int:
    """Prepare the job, write the observers file, run verl's trainer with it (its
    output in ``{save_path}/trainer.log``, a line here per finished step) and print
    the summary; return the trainer's exit code.  ``latest`` is pointed at the
    save path before the trainer starts."""
    from verl_events.verl_bridge import CONFIG_ENV

    from ..tables import terminal_console
    from ..verl_cpu.job import prepare, run_trainer, trainer_args, trainer_env

    console = terminal_console(stderr=True)
    started = time.perf_counter()
    save_path = start_run_folder(dataclasses.replace(load_config(config), latest=latest))
    config_path = save_path / CONFIG_FILE
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    log = save_path / TRAINER_LOG
    with console.status(f"demo: preparing the tiny job under {shown(job_dir)}"):
        files = prepare(job_dir)
    # soft_wrap: a path cut in two by the console's width cannot be copied.
    plural = "" if steps == 1 else "s"
    console.print(
        f"demo: verl's main_ppo, {steps} step{plural} on CPU, job files in {shown(files.root)}", soft_wrap=True
    )
    console.print(f"demo: observers from {shown(config_path)} ({CONFIG_ENV})", soft_wrap=True)
    console.print(f"demo: verl's output goes to {shown(log)}", soft_wrap=True)
    env = trainer_env()
    env[CONFIG_ENV] = str(config_path)

    def on_line(line: str) -> None:
        done = finished_step(line)
        if done is not None:
            took = f" in {done.seconds:.1f} s" if done.seconds is not None else ""
            console.print(f"demo: step {done.step}/{steps} done{took}")

    with console.status("demo: verl's trainer is starting (Ray, its workers, the model)"):
        code = run_trainer(trainer_args(files, steps=steps, save_path=save_path), env, log=log, on_line=on_line)
    if code != 0:
        print(f"the end of verl's trainer output ({shown(log)}):", file=sys.stderr)
        print("\n".join(tail(log, LOG_TAIL_LINES)), file=sys.stderr)
        print(
            f"error: verl's trainer (main_ppo) exited with code {code}; its output is in {shown(log)}", file=sys.stderr
        )
        return code if code > 0 else 128 - code  # killed by signal N: 128 + N, as a shell reports it
    observers = build_observers(load_config(config), set_up=False)
    written = [(o.name, o.outputs(save_path)) for o in observers]
    written += [(CONFIG_ENV, [config_path]), ("verl", [log])]  # the config every process read; verl's output
    seconds = time.perf_counter() - started
    msprobe = has_msprobe(config)
    names = [o.name for o in observers]
    print_summary(
        save_path,
        seconds,
        console,
        stages=tuple(STAGE_ROLES),
        msprobe_configured=msprobe,
        observers=names,
        written=written,
    )
    return 0


def command(args: argparse.Namespace) -> int:
    """``verl-events demo --engine verl``: check the options and run; 2 on a usage error."""
    problem = _unsupported(args)
    if problem is not None:
        option, why = problem
        print(
            f"error: {option} is not supported with --engine verl ({why}); it is an option of --engine tiny",
            file=sys.stderr,
        )
        return 2
    steps = DEFAULT_STEPS if args.steps is None else args.steps
    if steps < 1:
        print(f"error: --steps {steps} is not allowed; use 1 or more", file=sys.stderr)
        return 2
    missing = missing_modules()
    if missing:
        print(f"error: --engine verl needs {', '.join(missing)}, not installed here; {_INSTALL_HINT}", file=sys.stderr)
        return 2
    from .options import preflight

    try:
        config, latest = prepare_config(args.config, args.save_path)
        preflight(config)
    except (ConfigError, ObserverSetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run(config, steps, latest=latest)  # Ctrl-C: the CLI's one line
