"""The shell every ``verl-events`` command runs in: read, warn, print, exit.

A command hands :func:`run` its reader (a function of no arguments that reads RUN), the
exception that reader raises for bad input, how its result prints as text and as JSON,
and its exit rule.  The shell, in this order:

1. runs the reader;
2. prints each of the result's ``warnings`` as ``warning: ...``, then its ``notes`` as
   ``note: ...``, on stderr;
3. prints the result on stdout: with ``--json``, ``json.dumps(as_json(result), indent=1)``;
   else ``text(result)``, a string, or None when ``text`` printed the result itself (on a
   rich console);
4. calls ``after(result)``: what the command says last (the files it wrote);
5. returns ``exit_code(result)``: 0, or 1 for an alarm, as the command documents.

The input error, wherever it is raised, becomes one line on stderr, ``error: <sentence>``,
and exit 2 (:func:`fail`): the sentence is the exception's, which says what was wrong and
what to give instead.  What a command prints before it raised stays printed.

A command that finds a problem as it goes (a warning in the middle of a long read, an
error before there is anything to read) prints it with :func:`warn` and :func:`fail`, so
that every command says ``warning:`` and ``error:`` alike.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from verl_events.layout import LATEST_LINK

__all__ = ["add_run_command", "fail", "import_from_here", "run", "run_or_its_newest", "warn"]

Result = TypeVar("Result")


def warn(line: str) -> None:
    """``warning: line`` on stderr."""
    print(f"warning: {line}", file=sys.stderr)


def fail(problem: object, code: int = 2) -> int:
    """``error: problem`` on stderr; returns ``code`` (2, bad input, unless told)."""
    print(f"error: {problem}", file=sys.stderr)
    return code


def add_run_command(
    commands: Any,
    name: str,
    command: Callable[[argparse.Namespace], int],
    *,
    help: str,
    run: str = "the run's save_path",
    json_help: str = "print the result as JSON",
) -> argparse.ArgumentParser:
    """Add ``verl-events NAME RUN [--json]`` to the subcommands, run by ``command``; the
    parser, for the command's own options.  ``help`` is the command's line in ``--help``
    (with its exit codes), ``run`` what RUN is."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help)
    parser.add_argument("run", type=run_or_its_newest, help=f"{run} (a folder of runs: its newest, {LATEST_LINK})")
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.set_defaults(run_command=command)
    return parser


def import_from_here() -> None:
    """The current folder first on Python's path, where ``python -m`` puts it: a config's
    ``_target_`` beside it imports in ``check`` and ``demo`` as it does in the training run
    (``python -m verl.trainer.main_ppo``).  A console script alone does not look there."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def run_or_its_newest(value: str) -> str:
    """RUN as given; for a folder of runs (``save_path: .../{run}``, which holds their
    ``latest`` link and is no run itself), its newest run, said in a note."""
    latest = Path(value) / LATEST_LINK
    if latest.is_symlink() and latest.is_dir():
        print(f"note: {value} holds runs, a folder each; reading the newest, {latest}", file=sys.stderr)
        return str(latest)
    return value


def _no_lines(result: Any) -> Iterable[str]:
    return ()


def _success(result: Any) -> int:
    return 0


def run(
    args: argparse.Namespace,
    read: Callable[[], Result],
    input_error: type[Exception] | tuple[type[Exception], ...],
    *,
    text: Callable[[Result], str | None],
    as_json: Callable[[Result], Any] | None = None,
    exit_code: Callable[[Result], int] = _success,
    warnings: Callable[[Result], Iterable[str]] = _no_lines,
    notes: Callable[[Result], Iterable[str]] = _no_lines,
    after: Callable[[Result], None] | None = None,
    allow_nan: bool = True,
) -> int:
    """Run a command (see the module docstring); its exit code.  ``args.json`` (absent: False)
    asks for ``as_json``; ``allow_nan=False`` makes a NaN in the JSON a ValueError, for a
    command whose JSON never holds one."""
    try:
        result = read()
        for line in warnings(result):
            warn(line)
        for line in notes(result):
            print(f"note: {line}", file=sys.stderr)
        if as_json is not None and getattr(args, "json", False):
            print(json.dumps(as_json(result), indent=1, allow_nan=allow_nan))
        elif (shown := text(result)) is not None:
            print(shown)
        if after is not None:
            after(result)
    except input_error as exc:
        return fail(exc)
    return exit_code(result)
