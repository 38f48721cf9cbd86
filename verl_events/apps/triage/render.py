"""How ``verl-events triage`` prints a :class:`~.command.Triage`: a few labelled lines.

``anomaly`` (and how many more were recorded), ``replay`` and ``inputs`` when
the stage was replayed, ``dump`` (or ``dumps``, healthy -> after, for a spike),
then ``op``, ``module``, ``param`` and ``source``, or ``no op`` and why.
"""

from __future__ import annotations

from typing import Any

from ..formats import msprobe_layout
from .command import Triage

STACK_FILE = msprobe_layout.STACK_FILE

__all__ = ["render"]


def render(result: Triage, console: Any) -> None:
    """A few lines for the terminal."""

    def say(label: str, text: str, style: str | None = None) -> None:
        console.print(f"{label:<8}{text}", markup=False, highlight=False, soft_wrap=True, style=style)

    anomaly = result.anomaly
    if anomaly is None:
        console.print(result.reason, markup=False, highlight=False, soft_wrap=True)
        return
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
    kind = "the replay" if replayed else "after"
    if result.healthy_dump is not None and result.dump is not None:
        say("dumps", f"healthy {result.healthy_dump.path}  ->  {kind} {result.dump.path}")
    elif result.dump is not None:
        say("dump", f"{result.dump.path}" + ("  (the replay: the anomalous step itself)" if replayed else ""))
    finding = result.finding
    if finding is None:
        say("no op", result.reason, "yellow")
        return
    if finding.others is not None:
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
    say(
        "module",
        f"{finding.module} ({finding.module_entry})"
        if finding.module
        else "none recorded (level L1 records no modules, msprobe never hooks the root model, "
        "and an op outside every module's forward has none)",
    )
    if finding.parameter:
        moved = "" if finding.parameter_factor is None else f" (moved x{finding.parameter_factor:.3g})"
        say("param", finding.parameter + moved)
    source = finding.source
    say(
        "source",
        f"{source['file']}:{source['line']} in {source['function']}: {source['code']}"
        if source
        else f"no user frame in its call stack ({STACK_FILE} missing, or every frame in torch/msprobe/the stdlib)",
    )
