"""The ``verl-events`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import time

from ._config import _to_dict, load_config
from ._errors import ConfigError, ObserverSetupError


def _check(args: argparse.Namespace) -> int:
    """Validate a config and build its observers, as install() would."""
    from ._install import install

    try:
        config = load_config(args.config, args.overrides)
        with install(config) as installation:
            print(f"save_path: {config.save_path}  strict: {config.strict}")
            for observer in installation.observers:
                sel = observer.selection
                print(
                    f"  {observer.name:<20} priority={observer.priority:<4} steps={_fmt(sel.steps)} "
                    f"stages={_fmt(sel.stages)} roles={_fmt(sel.roles)} ranks={_fmt(sel.ranks)}"
                )
    except (ConfigError, ObserverSetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _demo(args: argparse.Namespace) -> int:
    """Run the miniature PPO loop with the configured observers."""
    for flag, value in (("--steps", args.steps), ("--nproc", args.nproc)):
        if value < 1:
            print(f"error: {flag} {value} is not allowed; use 1 or more", file=sys.stderr)
            return 2
    try:
        raw = _to_dict(args.config) if args.config else None
        save_path = args.save_path or (raw or {}).get("save_path") or time.strftime("outputs/demo-%Y%m%d-%H%M%S")
        from .demo import DemoOptions, default_config, run_demo

        config = dict(raw) if raw is not None else default_config(save_path)
        config["save_path"] = str(save_path)
        load_config(config)  # fail here, once, rather than in every process
        run_demo(DemoOptions(config=config, steps=args.steps, nproc=args.nproc, seed=args.seed))
    except (ConfigError, ObserverSetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _fmt(values: frozenset[object] | None) -> str:
    return "all" if values is None else "[" + ",".join(map(str, sorted(values, key=str))) + "]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-events", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate a config and list the observers it builds")
    check.add_argument("config", help="YAML config file")
    check.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. observers.0.steps=[1,2]")
    check.set_defaults(run=_check)

    demo = commands.add_parser("demo", help="run a miniature PPO loop on CPU with msprobe dumps and timing")
    demo.add_argument("--config", help="observers YAML (default: msprobe L1 on steps 1-2 for actor/ref stages, timing always)")
    demo.add_argument("--steps", type=int, default=6, help="training steps (default 6)")
    demo.add_argument("--save-path", help="output directory (default: a fresh outputs/demo-<time>)")
    demo.add_argument("--nproc", type=int, default=1, help="processes joined with torch.distributed gloo (default 1)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
