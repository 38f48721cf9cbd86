"""``verl-events hangs RUN [--json]``: the command, and its line in ``verl-events diagnose``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import shell
from ..read.liveness import liveness, newest
from ..read.ranks import count_heartbeats
from ..read.record import Evidence
from ..tools import Holding
from .find import Hangs, HangsInputError, find_hangs
from .render import render

__all__ = ["add_command", "command"]


#: The command's line in ``verl-events --help``; the other, what RUN is.
HELP = (
    "which rank is stuck where, from the watchdog's heartbeats and hang records "
    "(exit 0 none, 1 a deadline passed, 2 bad input)"
)
RUN_HELP = "the run's save_path (holding the watchdog's heartbeats)"


def add_command(commands: Any) -> None:
    """Add ``hangs`` to the ``verl-events`` parser's subcommands."""
    shell.add_run_command(commands, "hangs", command, help=HELP, run=RUN_HELP)


def command(args: Any) -> int:
    """``verl-events hangs RUN [--json]``; the exit code (see the package docstring)."""
    return shell.run(
        args,
        lambda: find_hangs(Path(args.run)),
        HangsInputError,
        text=render,
        as_json=Hangs.as_json,
        exit_code=lambda result: 1 if result.hangs or result.stalls else 0,
        warnings=lambda result: result.warnings,
    )


def headline(evidence: Evidence, holding: Holding) -> str:
    """The watchdog's line in ``verl-events diagnose``: how many heartbeats in which state,
    the stages past their deadline, the stalls."""
    last = newest(evidence.heartbeats)
    states = [liveness(beat, evidence.now, last).state for beat in evidence.heartbeats]
    counts = ", ".join(f"{states.count(s)} {s}" for s in ("alive", "closed", "gone", "silent") if s in states)
    hangs = f"; {evidence.hang_records} stage(s) past their deadline" if evidence.hang_records else ""
    late = f", {evidence.late_records} ended late" if evidence.late_records else ""
    stalls = ""
    if evidence.stalls:
        waiting = sum(stall.state == "waiting" for stall in evidence.stalls)
        stalls = f"; {len(evidence.stalls)} process stall(s) with no stage open" + (
            f", {waiting} waiting on another rank's stage" if waiting else ""
        )
    beating = count_heartbeats(beat.rank for beat in evidence.heartbeats)
    return f"{beating}{': ' + counts if counts else ''}{hangs}{late}{stalls}"
