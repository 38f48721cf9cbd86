"""``verl-events diagnose RUN``: how a run ended, which rank failed first, and what to run next.

Reads everything the observers left in RUN (:mod:`.evidence`), orders it
(:mod:`.verdict`) and prints, in this order: the verdict (healthy, failed,
hung, anomalous); the first failure (rank, host, pid, step, stage, kind,
what, where, when); the cascade, each with why it follows; one line per
tool of what else the run holds, with the command to read it; and what
the run could not show, with the observer that would have shown it.

``--json`` prints ``{"verdict", "first", "cascade", "tools", "unseen",
"teardown", "warnings", "read_in_part"}``; ``first`` is null for a healthy run; ``teardown``
lists the ranks a launcher stopped between stages after the driver (a
process without ranks) ended normally, as Ray does at every shutdown: not
failures.  Each failure has
``rank``, ``host``, ``pid``, ``step``, ``stage``, ``parent`` (the stage
enclosing it, if any), ``kind``, ``detail``,
``where`` (``file``, ``line``, ``function``, ``code``), ``time`` and
``source`` (a cascade item adds ``why``).  ``read_in_part`` names the logs of a large run
read in part (:mod:`.large_logs`), and how; empty when every line was read.

``--log FILE`` (repeatable) names the driver's output (its console log),
read for Ray's memory-monitor report, which names the pids Ray killed
(:mod:`.ray_kills`); ``RUN/trainer.log`` is read without it.

Exit codes: 0 nothing went wrong (``healthy``, or ``running``: no failure
yet and a rank still beats), 1 a failure, a hang or an anomaly was found,
2 bad input (RUN is not a folder, or holds nothing an observer writes, or a
``--log`` file is not there).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_events.layout import RUN_FILE

from .. import shell
from ..read.evidence import Evidence, Failure, gather
from ..read.large_logs import FULL_READ_BYTES
from ..read.liveness import liveness, newest
from ..read.ranks import (
    DRIVER_RANK,
    FOLDED,
    GENERATION_STAGES,
    number_ranges,
    numbers_aside,
    rank_list,
    ranks_phrase,
)
from ..read.record import not_a_folder
from ..tools import tool_lines, tools_and_problems
from .verdict import Verdict, judge

__all__ = ["DiagnoseInputError", "Diagnosis", "add_command", "command", "diagnose", "render"]


class DiagnoseInputError(ValueError):
    """RUN cannot be diagnosed (exit 2); the message names the path and why."""


class Diagnosis:
    """The verdict over a run, with the tools' lines and what could not be seen."""

    def __init__(
        self, evidence: Evidence, verdict: Verdict, tools: list[dict[str, str | None]], unseen: list[str]
    ) -> None:
        self.evidence = evidence
        self.verdict = verdict
        self.tools = tools
        self.unseen = unseen

    def as_json(self) -> dict[str, Any]:
        first = self.verdict.first
        return {
            "run": str(self.evidence.run),
            "verdict": self.verdict.verdict,
            "first": None if first is None else first.as_json(),
            "cascade": [failure.as_json() | {"why": why} for failure, why in self.verdict.cascade],
            "before": None if self.verdict.before is None else self.verdict.before.as_json(),
            "tools": self.tools,
            "unseen": self.unseen,
            "teardown": [failure.as_json() for failure in self.evidence.teardown],
            "warnings": self.evidence.warnings,
            "read_in_part": self.evidence.read_in_part,
        }


def diagnose(run: Path, logs: Sequence[Path] = (), *, read_all: bool = False) -> Diagnosis:
    """Read and judge RUN, with the driver's output files ``logs``; DiagnoseInputError when
    RUN is not a run folder or a log is not a file.  ``read_all``: every line of a large
    run's logs too (see :mod:`.large_logs`)."""
    if not run.is_dir():
        raise DiagnoseInputError(not_a_folder(run))
    for log in logs:
        if not log.is_file():
            raise DiagnoseInputError(
                f"--log {log} {'is not a file' if log.exists() else 'does not exist'}; pass the driver's output"
            )
    listed, problems = tools_and_problems()
    evidence = gather(run, logs, read_all=read_all)
    evidence.warnings += problems  # another package's observer that failed to import
    tools, unseen = tool_lines(evidence, listed), _unseen(evidence)
    if not tools and not evidence.failures:
        if evidence.run_id is not None:  # claimed: a writing observer received a stage here
            raise DiagnoseInputError(
                f"{run} holds run {evidence.run_id!r}'s {RUN_FILE} and nothing else: its observers received stages "
                "here and wrote nothing (a weight_sync observer that saw no sync, an msprobe whose steps never "
                "came); add '- name: timing' to record every stage and which observers received it"
            )
        raise DiagnoseInputError(
            f"{run} holds nothing an observer writes (no heartbeats, timing logs, crash records, hang, "
            "anomaly or mismatch logs, msprobe dumps); pass the save_path of a run"
        )
    last = newest(evidence.heartbeats)
    running = any(liveness(beat, evidence.now, last).state == "alive" for beat in evidence.heartbeats)
    return Diagnosis(evidence, judge(evidence.failures, running), tools, unseen)


def _unseen(evidence: Evidence) -> list[str]:
    unseen = []
    if not evidence.heartbeats and not evidence.stalls:
        unseen.append(
            "no watchdog: a rank killed without warning (SIGKILL, the OOM killer), a segfault's stacks, a "
            "stage's line and a hang cannot be seen; add '- name: watchdog' to the observers"
        )
    if not evidence.timing_ranks and not evidence.timing_driver:
        unseen.append(
            "no timing logs (no stage ended, or the timing observer was off): stage times and errors of ranks "
            "without the watchdog; add '- name: timing' if it was off"
        )
    return unseen


# -- text --------------------------------------------------------------------------


def _clock(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix)) + f".{int(unix % 1 * 1000):03d}Z"


_SHOWN = 260  # characters of a failure's detail shown in text
#: What to read when the driver's wait for generation fails: verl logs each prompt that
#: failed in generation, and goes on.
GENERATION_NOTE = (
    "the rollout: verl's agent loop workers generate in their own processes and log each prompt "
    "that failed there (an agent loop that raised, a rollout server that died) as "
    "'Error in _run_prompt', which Ray prints in the driver's output"
)


def _who(rank: int) -> str:
    """A failure's process: a trainer rank, verl's driver, or a process without a rank."""
    if rank >= 0:
        return f"rank {rank}"
    if rank == DRIVER_RANK:
        return "the driver (where verl's trainer loop runs)"
    return "a process without a rank (main_ppo, a launcher)"


def _at(failure: Failure, steps: str | None = None) -> str:
    """Where the failure was: its step (or ``steps``, of several alike) and stage."""
    step = steps or f"step {failure.step}"
    if not failure.stage:
        return "outside any stage"
    if failure.in_stage is None:
        return f"after {step}'s {failure.stage}, where since unknown"
    if failure.in_stage:
        return f"{step}, {failure.stage}" + (f" (in {failure.parent})" if failure.parent else "")
    return f"between stages, after {step}'s {failure.stage}"


def _shown(detail: str) -> str:
    """A failure's detail on one line of at most :data:`_SHOWN` characters (--json keeps it whole)."""
    line = detail.strip().split("\n")[0]
    return line[: _SHOWN - 1] + "…" if len(line) > _SHOWN or line != detail.strip() else line


def _failure_lines(failure: Failure, indent: str) -> list[str]:
    host = f" on {failure.host}" if failure.host else ""
    pid = f", pid {failure.pid}" if failure.pid else ""
    lines = [f"{indent}{_who(failure.rank)}{host}{pid}: {_at(failure)}: {failure.kind}: {_shown(failure.detail)}"]
    where = failure.where
    if where is not None:
        code = f": {where['code']}" if where.get("code") else ""
        lines.append(f"{indent}  at {where['file']}:{where['line']} in {where['function']}{code}")
    lines.append(f"{indent}  when {_clock(failure.time)} (from {failure.source})")
    return lines


def _cascade_lines(cascade: list[tuple[Failure, str]]) -> list[str]:
    """The cascade in its order, alike items folded into one where the first of them stood:
    three or more of the same kind, stage, reason and detail (its numbers aside: ports,
    counts) on other ranks or steps, as one line with their ranges."""
    alike: dict[tuple[Any, ...], list[Failure]] = {}
    keys = []
    for failure, why in cascade:
        key = (failure.kind, failure.stage, failure.in_stage, why, numbers_aside(_shown(failure.detail)))
        alike.setdefault(key, []).append(failure)
        keys.append(key)
    lines = []
    for (failure, why), key in zip(cascade, keys, strict=True):
        group = alike[key]
        if len(group) >= FOLDED and failure is not group[0]:
            continue  # folded into its group's line, where the first of them stood
        lines += _failure_lines(failure, "  ") if len(group) < FOLDED else _folded_lines(group)
        lines.append(f"    why: {why}")
    return lines


def _folded_lines(group: list[Failure]) -> list[str]:
    first, last = group[0], group[-1]
    steps = sorted({f.step for f in group if f.step is not None})
    at = _at(first, f"step {steps[0]}" if len(steps) == 1 else f"steps {number_ranges(steps)}")
    since, until = _clock(first.time), _clock(last.time)
    until = until.split(" ", 1)[1] if until.split(" ")[0] == since.split(" ")[0] else until  # the same day
    return [
        f"  {rank_list({f.rank for f in group})}: {at}: {first.kind}: {_shown(first.detail)} ({len(group)} alike)",
        f"    when {since} to {until} (from {first.source}, …)",
    ]


def render(diagnosis: Diagnosis) -> str:
    """The diagnosis as text, for a terminal."""
    verdict = diagnosis.verdict
    lines = [f"run: {diagnosis.evidence.run}", f"verdict: {verdict.verdict}"]
    if verdict.first is not None:
        lines.append("first failure:" if verdict.verdict != "anomalous" else "first anomaly:")
        lines += _failure_lines(verdict.first, "  ")
        if verdict.first.rank == DRIVER_RANK and verdict.first.stage in GENERATION_STAGES:
            lines.append(f"  the driver waits there for {GENERATION_NOTE}")
    if verdict.before is not None:
        before = verdict.before
        lines.append(f"  before it on the same rank: {_at(before)}: {before.kind}: {_shown(before.detail)}")
        lines.append(f"    when {_clock(before.time)} (from {before.source})")
    if verdict.cascade:
        lines.append(f"then ({len(verdict.cascade)}):")
        lines += _cascade_lines(verdict.cascade)
    if diagnosis.tools:
        lines.append("the run also holds:")
        width = max(len(str(t["tool"])) for t in diagnosis.tools)
        lines += [
            f"  {t['tool']!s:<{width}}  {t['summary']}" + (f": {t['command']}" if t["command"] else "")
            for t in diagnosis.tools
        ]
    teardown = diagnosis.evidence.teardown
    if teardown:
        lines.append(
            f"after the run ended normally, the launcher stopped {ranks_phrase(f.rank for f in teardown)} "
            "between stages (not a failure)"
        )
    lines += [f"not seen: {line}" for line in diagnosis.unseen]
    lines += [f"read in part: {part} (every line: --read-all)" for part in diagnosis.evidence.read_in_part]
    return "\n".join(lines)


# -- the command ----------------------------------------------------------------------


#: The command's line in ``verl-events --help``.
HELP = (
    "how a run ended: the first failure (rank, step, stage, line) and its cascade, and what to run next "
    "(exit 0 healthy or running, 1 failed, hung or anomalous, 2 bad input)"
)


def add_command(commands: Any) -> None:
    """Add ``diagnose`` to the ``verl-events`` parser's subcommands."""
    parser = shell.add_run_command(commands, "diagnose", command, help=HELP)
    parser.add_argument(
        "--log",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="the driver's output (repeatable), for the pids Ray's memory monitor killed; RUN/trainer.log is read "
        "without it",
    )
    parser.add_argument(
        "--read-all",
        action="store_true",
        help="read every line of a large run's timing, memory and weight-sync logs (by default, past "
        f"{FULL_READ_BYTES // 2**20} MiB of one kind, only what names a failure: the ends of the logs, the alarms)",
    )


def command(args: Any) -> int:
    """``verl-events diagnose RUN [--json] [--log FILE] [--read-all]``; the exit code (see the module docstring)."""
    return shell.run(
        args,
        lambda: diagnose(Path(args.run), args.log, read_all=args.read_all),
        DiagnoseInputError,
        text=render,
        as_json=Diagnosis.as_json,
        exit_code=lambda diagnosis: 0 if diagnosis.verdict.verdict in ("healthy", "running") else 1,
        warnings=lambda diagnosis: diagnosis.evidence.warnings,
    )
