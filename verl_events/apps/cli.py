"""The ``verl-events`` command line: a subcommand per command of :func:`.tools.tools`.

Each command lives beside its tool (its module's ``add_command`` and
``command``) and runs in :mod:`.shell` (warnings, ``--json``, ``error:`` and
exit codes); this module only builds the parser from the table and turns
what no command handles (Ctrl-C, an OSError from the environment) into one
line and an exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .shell import fail
from .tools import add_commands, command_tools, tools


def build_parser() -> argparse.ArgumentParser:
    listed = tools()
    reading = ", ".join(str(tool.command) for tool in command_tools(listed) if tool.command not in ("check", "demo"))
    parser = argparse.ArgumentParser(
        prog="verl-events",
        description=f"Check configs, run the CPU demo, and read runs back: {reading}.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    add_commands(commands, listed)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("verl-events")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


#: What ``verl-events`` alone prints: what to keep on, and what to run first when a run fails.
START = """\
verl-events: the stage, rank and line where a verl run went wrong.

Keep the always-on set on (a folder per run under outputs/profile/, the newest is latest):
  VERL_EVENTS_CONFIG=always_on python3 -m verl.trainer.main_ppo ...

When a run failed, hung or went wrong, start here:
  verl-events diagnose outputs/profile/latest

Every command: verl-events --help; one command's options: verl-events COMMAND --help."""


def main(argv: Sequence[str] | None = None) -> int:
    if not (sys.argv[1:] if argv is None else argv):
        print(START)
        return 0
    args = build_parser().parse_args(argv)
    try:
        return int(args.run_command(args))
    except KeyboardInterrupt:
        # The bus has already closed every open stage: sessions cut short are
        # marked incomplete on disk.  One line, no traceback.
        print("verl-events: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # a full disk, a path that cannot be written: the environment, not a bug
        return fail(exc)


if __name__ == "__main__":
    sys.exit(main())
