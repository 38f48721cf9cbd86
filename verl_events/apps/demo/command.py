"""The ``demo`` command: its arguments, the engine it runs and its exit codes.

Exit codes: 0 the demo ran, 1 a rank failed, 2 bad input (an option, a
config, a missing torch); with ``--engine verl``, the trainer's own code.
Importing this module imports no torch: the engines are imported when run.
"""

from __future__ import annotations

import argparse
from typing import Any

from verl_events import ConfigError, ObserverSetupError
from verl_events.config import load_config, read_config

from .. import shell

__all__ = ["DEMO_SAVE_PATH", "add_command", "command"]

#: Where the demo writes unless told: a folder per run, outputs/demo/latest the newest.
DEMO_SAVE_PATH = "outputs/demo/{run}"


def add_command(commands: Any) -> None:
    """Add ``demo`` to the ``verl-events`` parser's subcommands."""
    demo = commands.add_parser("demo", help="run a miniature PPO loop on CPU with msprobe dumps and timing")
    demo.add_argument(
        "--engine",
        choices=("tiny", "verl"),
        default="tiny",
        help="tiny: the miniature loop (default); verl: verl's real trainer on CPU (needs the verl-cpu extra)",
    )
    demo.add_argument(
        "--config",
        help="observers YAML (default: msprobe L1 on steps 1-2 for actor/ref stages, timing always; "
        "verl engine: also torch.profiler on step 2's actor_update)",
    )
    demo.add_argument("--steps", type=int, help="training steps (default 6; verl engine 3)")
    demo.add_argument(
        "--save-path",
        help="output directory, {run} allowed (default: outputs/demo/{run}, a folder per run with "
        "outputs/demo/latest the newest; verl engine outputs/verl-demo/{run}, latest beside it)",
    )
    demo.add_argument(
        "--nproc", type=int, default=1, help="processes joined with torch.distributed gloo (default 1; tiny engine)"
    )
    demo.add_argument("--seed", type=int, help="seed (default 0; tiny engine)")
    demo.add_argument(
        "--perturb",
        type=float,
        default=0.0,
        help="scale one actor weight (blocks.1.mlp.0) by 1+PERTURB, to try compare (tiny engine)",
    )
    demo.add_argument(
        "--inject",
        metavar="KIND@STEP",
        help="nan@STEP or spike@STEP: corrupt that actor weight at STEP's update on the last rank, "
        "to try the sentinel; nan-once@STEP or nan-flaky@STEP: a NaN in STEP's actor_compute_log_prob "
        "only, which its replay shows again (once) or not (flaky) (tiny engine; see docs/sentinel.md)",
    )
    demo.set_defaults(run_command=command)


def command(args: argparse.Namespace) -> int:
    """Run the miniature PPO loop (or, with --engine verl, verl's trainer) with the configured observers."""
    shell.import_from_here()
    if args.engine == "verl":
        from .verl_engine import command as verl_command

        return verl_command(args)
    steps = 6 if args.steps is None else args.steps
    for flag, value in (("--steps", steps), ("--nproc", args.nproc)):
        if value < 1:
            return shell.fail(f"{flag} {value} is not allowed; use 1 or more")
    from .options import DemoOptions, Injection, default_config, preflight

    try:
        from .tiny import DemoRankError, run_demo
    except ImportError as exc:  # the demo trains a model: torch, from the demo extra
        if exc.name is None or exc.name.partition(".")[0] != "torch":
            raise
        return shell.fail(
            f"the demo needs torch, which cannot be imported here ({exc}); "
            "install it from a clone of verl-events with: pip install '.[demo,msprobe]'"
        )

    try:
        inject = Injection.parse(args.inject, steps) if args.inject is not None else None
    except ValueError as exc:
        return shell.fail(exc)
    try:
        raw = read_config(args.config) if args.config else None
        save_path = args.save_path or (raw or {}).get("save_path") or DEMO_SAVE_PATH

        config = dict(raw) if raw is not None else default_config(save_path)
        config["save_path"] = str(save_path)
        if args.nproc > 1:
            preflight(config)  # once here: a spawned rank would fail with a traceback
        else:
            load_config(config)
        seed = 0 if args.seed is None else args.seed
        run_demo(DemoOptions(config, steps, args.nproc, seed, perturb=args.perturb, inject=inject))
    except (ConfigError, ObserverSetupError) as exc:
        return shell.fail(exc)
    except DemoRankError as exc:
        return shell.fail(exc, code=1)
    return 0
