"""The ``diagnose`` command (being built)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["add_command", "command"]


def add_command(commands: Any) -> None:
    """Add ``diagnose`` to the ``verl-events`` parser's subcommands."""
    parser = commands.add_parser(
        "diagnose", help="how a run ended: the first failure and its cascade (exit 0 healthy, 1 failure, 2 bad input)"
    )
    parser.add_argument("run", help="the run's save_path")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(run_command=command)


def command(args: Any) -> int:
    print("error: diagnose is not built yet", file=sys.stderr)
    return 2
