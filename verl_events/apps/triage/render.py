"""The ``triage`` command's face: its arguments, how it prints a :class:`~.command.Triage`
(a few labelled lines, or ``--json``) and its exit codes (0 no anomaly, 1 an anomaly, 2 bad input).

``anomaly`` (and how many more were recorded), ``replay`` and ``inputs`` when
the stage was replayed (and ``origin`` after a transient replay: no dump holds
the op that made the fault), ``dump`` (or ``dumps``, healthy -> after, for a
spike), then ``op`` (``later`` after a transient replay: where the bad values
travelled, not their cause), ``module``, ``param`` and ``source``, or ``no op``
and why.  The source's file is shown by :func:`shown_path`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from verl_events.observers.msprobe import layout as msprobe_layout
from verl_events.observers.sentinel import record as anomaly_record

from .. import shell
from ..read.record import Evidence
from ..tables import terminal_console
from ..tools import Holding
from .command import Anomaly, Triage, TriageInputError, triage
from .finding import Finding

STACK_FILE = msprobe_layout.STACK_FILE

__all__ = ["add_command", "command", "render", "shown_path"]

# Where a library's files sit: what follows the last of these is the file's place in its package.
_PACKAGE_ROOTS = ("site-packages", "dist-packages")


#: The command's line in ``verl-events --help``; the other, what RUN is.
HELP = (
    f"name the op behind a run's first anomaly, from {anomaly_record.ANOMALY_LOG} and msprobe's dumps "
    "(exit 0 none, 1 anomaly, 2 bad input)"
)
RUN_HELP = f"the run's save_path (holding {anomaly_record.ANOMALY_LOG} and msprobe's dumps)"


def add_command(commands: Any) -> None:
    """Add ``triage`` to the ``verl-events`` parser's subcommands."""
    shell.add_run_command(commands, "triage", command, help=HELP, run=RUN_HELP)


def command(args: argparse.Namespace) -> int:
    """Name the op behind a run's first recorded anomaly."""
    return shell.run(
        args,
        lambda: triage(Path(args.run)),
        TriageInputError,
        text=lambda result: render(result, terminal_console(stderr=False)),
        as_json=Triage.as_json,
        exit_code=lambda result: 0 if result.anomaly is None else 1,
        warnings=lambda result: result.warnings,
        notes=lambda result: result.notes,
    )


class _Lines:
    """Labelled lines on a rich console: the label in a column of its own, the text never marked up."""

    def __init__(self, console: Any) -> None:
        self.console = console

    def __call__(self, label: str, text: str, style: str | None = None) -> None:
        self.console.print(f"{label:<8}{text}", markup=False, highlight=False, soft_wrap=True, style=style)


def render(result: Triage, console: Any) -> None:
    """A few lines for the terminal."""
    anomaly = result.anomaly
    if anomaly is None:
        console.print(result.reason, markup=False, highlight=False, soft_wrap=True)
        return
    say = _Lines(console)
    _say_anomaly(result, anomaly, say)
    finding = result.finding
    if finding is None:
        say("no op", result.reason, "yellow")
        return
    _say_op(result, anomaly, finding, say)
    _say_source(finding, say)


def _say_anomaly(result: Triage, anomaly: Anomaly, say: _Lines) -> None:
    """The anomaly (and how many followed), its replay, and the dump(s) searched."""
    say("anomaly", anomaly.describe(), "bold")
    if len(result.anomalies) > 1:
        later = sorted({a.record.step for a in result.anomalies[1:]}, key=lambda step: (step is None, step or 0))
        steps = ", ".join(str(step) for step in later)
        say("", f"({len(result.anomalies) - 1} more recorded, step(s) {steps}; the first is triaged)")
    replay, replayed = result.replay, result.in_replay
    if replay is not None:
        say("replay", replay.describe(), "bold")
        if replay.inputs is not None:
            say("inputs", f"{replay.inputs} (the stage's tensor inputs; torch.load them to see which rows carried it)")
    if result.downstream and anomaly.step is not None:
        say(
            "origin",
            f"not captured: the replay of step {anomaly.step} ran clean (the fault did not reproduce), "
            "so no dump holds the op that made it",
        )
    kind = "the replay" if replayed else "after"
    if result.healthy_dump is not None and result.dump is not None:
        say("dumps", f"healthy {result.healthy_dump.path}  ->  {kind} {result.dump.path}")
    elif result.dump is not None:
        say("dump", f"{result.dump.path}" + ("  (the replay: the anomalous step itself)" if replayed else ""))


def _say_op(result: Triage, anomaly: Anomaly, finding: Finding, say: _Lines) -> None:
    """The op found: where the bad values went (after a transient replay), the first to read a
    parameter that jumped, the first with a NaN/Inf, or the earliest that moved most."""
    if result.downstream and result.dump is not None:
        dump, spiked = result.dump, finding.factor is not None or finding.others is not None
        what = "the one that moved most" if spiked else "the first with a NaN/Inf"
        say(
            "later",
            f"{finding.op}  ({what} in step {dump.step}'s {dump.stage}: {', '.join(finding.parts)}): where the "
            f"bad values travelled after step {anomaly.step}, not where they came from",
            "yellow",
        )
    elif finding.others is not None:
        output = "" if finding.factor is None else f"; its output norm x{finding.factor:.3g}"
        say(
            "op",
            f"{finding.op}  (parameter {finding.parameter} moved x{finding.parameter_factor:.3g}, the median parameter "
            f"x{finding.others:.4g}: the first op to read it, {', '.join(finding.parts)}{output})",
            "bold red",
        )
    elif finding.factor is None:
        say("op", f"{finding.op}  (first in execution order with a NaN/Inf: {', '.join(finding.parts)})", "bold red")
    else:
        largest = (
            "the largest move"
            if finding.largest is None
            else (f"the earliest move of the order of the largest, {finding.largest[0]} x{finding.largest[1]:.3g}")
        )
        say("op", f"{finding.op}  ({', '.join(finding.parts)} norm x{finding.factor:.3g}: {largest})", "bold red")


def _say_source(finding: Finding, say: _Lines) -> None:
    """The op's module, the parameter it read, and the user's line that called it."""
    say("module", f"{finding.module} ({finding.module_entry})" if finding.module else finding.no_module or "none")
    if finding.parameter:
        moved = "" if finding.parameter_factor is None else f" (moved x{finding.parameter_factor:.3g})"
        say("param", finding.parameter + moved)
    source = finding.source
    say(
        "source",
        f"{shown_path(source['file'])}:{source['line']} in {source['function']}: {source['code']}"
        if source
        else f"no user frame in its call stack ({STACK_FILE} missing, or every frame in torch/msprobe/the stdlib)",
    )


def shown_path(file: str, cwd: Path | None = None) -> str:
    """``file`` as the source line shows it: relative to ``cwd`` (default: the current
    directory) when under it; else from its top package (``.../verl_events/apps/demo/model.py``,
    ``.../transformers/models/...``), the same on every machine, with ``.../`` for what was
    left out; else under ``~``; else as recorded.  The JSON keeps the recorded path."""
    path = Path(file)
    if not path.is_absolute():
        return file
    here = Path.cwd() if cwd is None else cwd
    if path.is_relative_to(here):
        return str(path.relative_to(here))
    parts = path.parts
    roots = [i for i, part in enumerate(parts) if part in _PACKAGE_ROOTS]
    top = roots[-1] + 1 if roots else _top_package(path)
    if top is not None and top < len(parts) - 1:
        return ".../" + "/".join(parts[top:])
    home = Path.home()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else file


def _top_package(path: Path) -> int | None:
    """The index, in ``path.parts``, of the outermost folder of the Python package that
    holds ``path`` (folders with an ``__init__.py``, read on this machine); None when none does."""
    top = None
    for index in range(len(path.parts) - 2, 0, -1):
        if not (Path(*path.parts[: index + 1]) / "__init__.py").is_file():
            break
        top = index
    return top


def headline(evidence: Evidence, holding: Holding) -> str:
    """The sentinel's line in ``verl-events diagnose``: how many anomalies, and the first."""
    anomalies = [f for f in evidence.failures if f.kind == "anomaly"]
    if not anomalies:
        return holding.describe()
    first = min(anomalies, key=lambda f: f.time)
    return f"{len(anomalies)} anomal{'y' if len(anomalies) == 1 else 'ies'}, first at step {first.step} ({first.stage})"
