"""What both demo engines print at the end: the overhead table, the dumps, the files.

Paths are shown relative to the working directory when they are under it, as a
user would type them.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from verl_events.observers import timing as timing_log
from verl_events.observers.msprobe import layout

from ..read.overhead import TimingLogError, overhead_table, read_timing_records

__all__ = ["has_msprobe", "print_outputs", "print_summary", "shown"]

#: The msprobe observer's entry point name.
MSPROBE = "msprobe"


def shown(path: Path) -> str:
    """``path`` as the user would type it: relative to the working directory when under it."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def has_msprobe(config: Any) -> bool:
    """Whether ``config`` (anything :func:`~verl_events.config.load_config` reads) has an
    enabled msprobe observer, its own or a preset's."""
    from verl_events.config import load_config

    return any(spec.enabled and spec.name == MSPROBE for spec in load_config(config).observers)


def observer_names(config: Any) -> list[str]:
    """The names of the observers ``config`` switches on."""
    from verl_events.config import load_config

    return [str(spec.name) for spec in load_config(config).observers if spec.enabled and spec.name]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def print_summary(
    save_path: Path,
    seconds: float,
    console: Any,
    *,
    stages: Sequence[str],
    msprobe_configured: bool,
    observers: Sequence[str] = (),
    written: Iterable[tuple[str, Sequence[Path]]] | None = None,
) -> None:
    """The overhead table (rows in ``stages``' order), the msprobe dumps, what each
    observer wrote (``written``, see :func:`print_outputs`) and how to see the run again.

    ``msprobe_configured``: whether the config has an msprobe observer, so that a run
    without dumps says why: none was asked for, or it selected no stage that ran.
    """
    from ..overhead_table import render_overhead

    skipped: list[str] = []
    try:
        rows = overhead_table(read_timing_records(save_path, skipped=skipped), tuple(stages))
    except TimingLogError as exc:
        console.print(f"[red]the overhead table cannot be shown:[/] {exc}")
        rows = []
    for note in skipped:
        console.print(f"[yellow]warning:[/] {note}")
    timing_dir = shown(save_path / timing_log.TIMING_DIR)
    render_overhead(rows, console, title=f"Stage overhead, from {timing_dir} (medians over all ranks)")
    dumps = [dump for session in layout.session_dirs(save_path) if (dump := layout.dump_file(session)).is_file()]
    where = shown(save_path)
    if dumps:
        first = dumps[0].relative_to(save_path)
        files = f"{_plural(len(dumps), f'msprobe {layout.DUMP_FILE} file')} under {where}"
        console.print(f"{files} (first: {first})" if len(dumps) > 1 else f"{files}: {first}", soft_wrap=True)
    elif msprobe_configured:
        console.print(
            f"no msprobe dumps under {where}: the msprobe observer selected no stage that ran", soft_wrap=True
        )
    else:
        console.print("no msprobe dumps: the config has no msprobe observer")
    print_watched(save_path, observers, console)
    if written is not None:
        print_outputs(save_path, written, console)
    # soft_wrap: a path or a command cut in two by the console's width cannot be copied.
    console.print(f"demo finished in {seconds:.1f} s{_again(save_path, where)}", soft_wrap=True)


def _again(save_path: Path, where: str) -> str:
    """How to read the run again, as it runs when pasted in this shell: the report of its
    timing logs, else its diagnosis; nothing for a run that wrote nothing."""
    from ..tools import run_holds

    if timing_log.timing_log_files(save_path):
        return f"; see it again with: {this_command()} report {where}"
    if save_path.is_dir() and run_holds(save_path):
        return f"; read it again with: {this_command()} diagnose {where}"
    return f"; no observer wrote under {where}"


def this_command() -> str:
    """``verl-events`` as this shell finds it: its name where the shell's PATH leads to this
    installation's, else its path (``.venv/bin/verl-events`` after ``bash scripts/demo.sh``,
    whose environment is not the shell's)."""
    here = Path(sys.executable).parent / "verl-events"
    found = shutil.which("verl-events")
    if found is not None and Path(found).resolve() == here.resolve():
        return "verl-events"
    return shown(here) if here.exists() else "verl-events"


def print_watched(save_path: Path, observers: Sequence[str], console: Any) -> None:
    """What the watchers saw, in diagnose's words (its line per tool, without the commands), and
    the installed ``observers`` of those tools that wrote nothing: they write what they find."""
    from ..read.evidence import gather
    from ..tools import tool_lines, tools

    try:
        lines = [(str(line["tool"]), str(line["summary"])) for line in tool_lines(gather(save_path))]
    except OSError:  # nothing there to read: the closing line says so
        return
    seen = {tool for tool, _ in lines}
    lines += [
        (tool.name, f"no {tool.noun}: it found nothing to write")
        for tool in tools()
        if tool.name in observers and tool.name not in seen and tool.writes is not None
    ]
    if not lines:
        return
    where = shown(save_path)
    console.print(f"what the observers saw ({this_command()} diagnose {where} tells what it means):", soft_wrap=True)
    width = max(len(tool) for tool, _ in lines)
    for tool, summary in lines:
        console.print(f"  {tool:<{width}}  {summary}", soft_wrap=True, highlight=False)


def print_outputs(save_path: Path, written: Iterable[tuple[str, Sequence[Path]]], console: Any) -> None:
    """Name every file under ``save_path`` that each observer wrote: ``written`` holds
    (observer name, what its ``outputs`` lists); a folder is shown with the files in it."""
    console.print(f"what the observers wrote under {shown(save_path)}:", soft_wrap=True)
    for name, paths in written:
        if not paths:
            console.print(f"  {name}: nothing")
        for path in paths:
            inside = sorted(p.name for p in path.iterdir() if p.is_file()) if path.is_dir() else []
            held = f"/ ({', '.join(inside)})" if inside else ""
            console.print(f"  {name}: {path.relative_to(save_path)}{held}", soft_wrap=True)
