"""The read side's tools, derived from what each observer declares.

An observer class declares what it writes (:class:`verl_events.Writes`: its files, what
they are called, and the ``verl-events`` command that reads them); :func:`tools` turns
every installed observer that declares it, ours and other packages' alike, into a
:class:`Tool`, between the read side's own commands:

* ``check`` and ``demo`` first, then the observers' commands by name, then ``diagnose``
  and ``gather`` (``diagnose`` reads every observer's files, ``gather`` copies them);
* a tool without a command (tracker, the profilers) still says what a run folder holds
  (:func:`run_holds`, for ``check`` and ``diagnose``);
* one command may read several observers' files (``report``: the timing and the memory
  logs): it is added to the parser once (:func:`command_tools`).

The ``verl-events`` parser is built from it (:func:`add_commands`); tests/test_tools.py
holds README's list of commands to it.  A command module defines ``add_command(commands)``
(adds its parser to argparse's subcommands and sets ``run_command``) and ``command(args)``
(runs it, returns the exit code); command modules are imported when the parser is built.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from verl_events import Writes
from verl_events.config import writing_observers

if TYPE_CHECKING:
    from .read.record import Evidence

__all__ = [
    "Holding",
    "Tool",
    "add_commands",
    "command_module",
    "command_tools",
    "run_holds",
    "tool_lines",
    "tools",
    "tools_and_problems",
]

#: What a tool's ``files`` is: its files under a save_path, found by a few globs.
FileFinder = Callable[[Path], list[Path]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool of the read side: a command, an observer's files, or both.

    ``command``: the subcommand (``verl-events COMMAND``), or None; ``module``: its module,
    by import path; ``observer``: the entry point (group ``verl_events.observers``) of the
    observer whose files it reads, with what that observer ``writes``."""

    command: str | None
    module: str | None
    observer: str | None = None
    writes: Writes | None = None

    @property
    def noun(self) -> str:
        return self.writes.noun if self.writes is not None else ""

    @property
    def files(self) -> Callable[[Path], list[Path]] | None:
        return self.writes.files if self.writes is not None else None

    @property
    def owner(self) -> ModuleType | None:
        """The module that defines the files: the format's owner."""
        return sys.modules.get(self.writes.files.__module__) if self.writes is not None else None

    @property
    def name(self) -> str:
        """The observer's name, or the command's for the read side's own."""
        return self.observer or str(self.command)


#: The read side's own commands, before and after the observers'.
_FIRST = (Tool("check", "verl_events.apps.check"), Tool("demo", "verl_events.apps.demo.command"))
_LAST = (Tool("diagnose", "verl_events.apps.diagnose"), Tool("gather", "verl_events.apps.gather.command"))


def tools_and_problems() -> tuple[list[Tool], list[str]]:
    """:func:`tools`, and a sentence for each observer entry point that failed to import,
    from one loading of the entry points."""
    found, problems = writing_observers()
    declared = [Tool(cls.writes.command, cls.writes.module, name, cls.writes) for name, cls in found if cls.writes]
    by_command = [tool for tool in declared if tool.command is not None]
    with_command = sorted(by_command, key=lambda tool: (str(tool.command), tool.name))
    return [*_FIRST, *with_command, *_LAST, *(tool for tool in declared if tool.command is None)], problems


def tools() -> list[Tool]:
    """Every tool, in the order ``verl-events --help`` lists the commands; the tools without
    a command last.  An observer whose entry point fails to import is left out
    (:func:`tools_and_problems` says so)."""
    return tools_and_problems()[0]


def command_module(tool: Tool) -> ModuleType:
    """The module of ``tool``'s command; TypeError naming the module when it
    lacks ``add_command`` or ``command``."""
    module = importlib.import_module(str(tool.module))
    missing = [name for name in ("add_command", "command") if not callable(getattr(module, name, None))]
    if missing:
        raise TypeError(
            f"{tool.module}, the module of the {tool.command!r} command, has no {' and no '.join(missing)}; "
            "a command module defines add_command(commands) and command(args)"
        )
    return module


def command_tools(listed: list[Tool] | None = None) -> list[Tool]:
    """The tools with a command (of ``listed``, default :func:`tools`), one per command: the
    first (several observers' files may be read by one command, as report reads the timing
    and the memory logs)."""
    first: dict[str, Tool] = {}
    for tool in listed if listed is not None else tools():
        if tool.command is not None:
            first.setdefault(tool.command, tool)
    return list(first.values())


def add_commands(commands: Any, listed: list[Tool] | None = None) -> None:
    """Add every command of :func:`tools` to argparse's ``commands`` (from ``add_subparsers``)."""
    for tool in command_tools(listed):
        command_module(tool).add_command(commands)


@dataclass(frozen=True, slots=True)
class Holding:
    """What a save_path holds of one tool's files (never none)."""

    tool: Tool
    files: list[Path]

    def describe(self) -> str:
        """``3 timing log(s)``."""
        return f"{len(self.files)} {self.tool.noun}"


def run_holds(
    save_path: Path, listed: list[Tool] | None = None, find: Callable[[FileFinder], list[Path]] | None = None
) -> list[Holding]:
    """Each tool (of ``listed``, default :func:`tools`) whose observer left files under
    ``save_path``, with them, in that order; a few globs, nothing read.  ``find`` asks a
    tool's ``files`` for the run's (a reader that globbed them already answers from memory)."""
    found = []
    for tool in listed if listed is not None else tools():
        if tool.files is None:
            continue
        files = find(tool.files) if find is not None else tool.files(save_path)
        if files:
            found.append(Holding(tool, files))
    return found


def tool_lines(evidence: Evidence, listed: list[Tool] | None = None) -> list[dict[str, str | None]]:
    """A line per tool whose files the run holds (:func:`run_holds`), with the command that
    reads them: the command module's ``headline(evidence, holding)``, else how many files of
    what; its ``suggestion(evidence, holding)`` (None: nothing runs on this run alone), else
    ``verl-events COMMAND RUN``: each runs as printed."""
    lines = []
    for holding in run_holds(evidence.run, listed, find=evidence.files):
        tool = holding.tool
        module = command_module(tool) if tool.command is not None else None
        headline = getattr(module, "headline", None)
        summary = headline(evidence, holding) if headline is not None else holding.describe()
        suggestion = getattr(module, "suggestion", None)
        if module is None:
            command = None
        elif suggestion is not None:
            command = suggestion(evidence, holding)
        else:
            command = f"verl-events {tool.command} {evidence.run}"
        lines.append({"tool": tool.name, "summary": summary, "command": command})
    return lines
