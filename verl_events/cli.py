"""The ``verl-events`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._config import load_config
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


def _fmt(values: frozenset[object] | None) -> str:
    return "all" if values is None else "[" + ",".join(map(str, sorted(values, key=str))) + "]"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-events", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="validate a config and list the observers it builds")
    check.add_argument("config", help="YAML config file")
    check.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. observers.0.steps=[1,2]")
    check.set_defaults(run=_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
