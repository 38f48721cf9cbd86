"""The read side's one registration: a row per ``verl-events`` command.

Each :class:`Tool` row names

* ``command``: the subcommand (``verl-events COMMAND``);
* ``module``: the module that implements it, by import path, with
  ``add_command(commands)`` (adds its parser to argparse's subcommands and
  sets ``run_command``) and ``command(args)`` (runs it, returns the exit
  code);
* ``observer``: the entry point (group ``verl_events.observers``) of the
  observer whose files the command reads, or None for a command that reads
  no observer's files (``check``, ``demo``, ``diagnose``, which reads them all,
  ``gather``, which copies them all);
* ``owner``: that observer's format owner, the module of :mod:`.formats`
  that defines its files; ``files`` (the owner's function, or a composition
  of its functions) lists those files under a save_path, ``noun`` says what
  they are called (as the observer's ``output_noun`` does).

The ``verl-events`` parser is built from :data:`TOOLS`, in its order
(:func:`add_commands`); ``check`` asks :func:`run_holds` what an earlier run
left in a save_path.  tests/test_tools.py holds the other lists to this
one: every command is in README's list, every format owner's files are in
tests/test_owners.py's OWNERS.  Nothing here imports a tool library; the
command modules are imported when the parser is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .formats import anomaly_record, hang_record, mismatch_record, msprobe_layout, timing_log, weight_sync_record

__all__ = ["TOOLS", "Holding", "Tool", "add_commands", "command_module", "run_holds"]


@dataclass(frozen=True, slots=True)
class Tool:
    """One command of the read side; see the module docstring for the fields.
    ``files`` and ``noun`` are set exactly when ``owner`` is."""

    command: str
    module: str
    observer: str | None = None
    owner: ModuleType | None = None
    noun: str = ""
    files: Callable[[Path], list[Path]] | None = None


#: Every command, in the order ``verl-events --help`` lists them.
TOOLS: tuple[Tool, ...] = (
    Tool("check", "verl_events.apps.check"),
    Tool("demo", "verl_events.apps.demo.command"),
    Tool(
        "report", "verl_events.apps.report.command", "timing", timing_log, "timing log(s)", timing_log.timing_log_files
    ),
    Tool(
        "compare",
        "verl_events.apps.compare.command",
        "msprobe",
        msprobe_layout,
        "msprobe dump(s)",
        msprobe_layout.session_dirs,
    ),
    Tool(
        "triage",
        "verl_events.apps.triage.render",
        "sentinel",
        anomaly_record,
        "anomaly record file(s)",
        anomaly_record.record_files,
    ),
    Tool("hangs", "verl_events.apps.hangs", "watchdog", hang_record, "watchdog file(s)", hang_record.watchdog_files),
    Tool(
        "mismatch",
        "verl_events.apps.mismatch.command",
        "mismatch",
        mismatch_record,
        "mismatch record file(s)",
        mismatch_record.mismatch_files,
    ),
    Tool(
        "weights",
        "verl_events.apps.weights",
        "weight_sync",
        weight_sync_record,
        "weight-sync ledger(s)",
        weight_sync_record.weight_sync_files,
    ),
    Tool("diagnose", "verl_events.apps.diagnose"),
    Tool("gather", "verl_events.apps.gather.command"),
)


def command_module(tool: Tool) -> ModuleType:
    """The module of ``tool``'s command; TypeError naming the module when it
    lacks ``add_command`` or ``command``."""
    module = importlib.import_module(tool.module)
    missing = [name for name in ("add_command", "command") if not callable(getattr(module, name, None))]
    if missing:
        raise TypeError(
            f"{tool.module}, the module of the {tool.command!r} command, has no {' and no '.join(missing)}; "
            "a command module defines add_command(commands) and command(args)"
        )
    return module


def add_commands(commands: Any) -> None:
    """Add every command of :data:`TOOLS` to argparse's ``commands`` (from ``add_subparsers``)."""
    for tool in TOOLS:
        command_module(tool).add_command(commands)


@dataclass(frozen=True, slots=True)
class Holding:
    """What a save_path holds of one tool's files (never none)."""

    tool: Tool
    files: list[Path]

    def describe(self) -> str:
        """``3 timing log(s)``."""
        return f"{len(self.files)} {self.tool.noun}"


def run_holds(save_path: Path) -> list[Holding]:
    """Each tool whose observer left files under ``save_path``, with them, in
    :data:`TOOLS` order; a few globs, nothing read."""
    found = []
    for tool in TOOLS:
        if tool.files is not None and (files := tool.files(save_path)):
            found.append(Holding(tool, files))
    return found
