"""``verl-events checkpoints RUN``: every checkpoint save and load of a run, what each rank
saved, whether the resume restored it, whether the resumed run trained, and the alarms.

Reads the ``checkpoint`` observer's ledger (``checkpoints.jsonl``, format owner
:mod:`verl_events.observers.checkpoint.record`, read back by
:mod:`~verl_events.observers.checkpoint.ledger`): one row per save and rank, one per load
and rank, the trainer loop's end on the driver, then each alarm with the part and the
tensors it names.  A save that began and never finished, or whose files have another size
now than when written, is ``incomplete`` (found here, by the files' sizes: nothing is read).

``--json`` prints ``{"run", "saves": [{"step", "rank", "path", "began", "saved", "alarms",
"gone"}], "loads": [...], "loops": [...], "alarms": [{"step", "rank", "what", "kind",
"part", "tensors", "count", "detail"}], "warnings"}``.  A line that is not a record, and a
record of another run, are skipped with a warning.

Exit codes: 0 no alarm, 1 an alarm, 2 bad input (no such folder, no ledger, no record of
this run in it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verl_events.events.stages import rank_name
from verl_events.observers.checkpoint import ledger as checkpoint_ledger
from verl_events.observers.checkpoint import record as checkpoint_record

from . import shell
from .read.record import Evidence
from .tools import Holding

__all__ = ["CheckpointsInputError", "add_command", "command", "headline", "read_checkpoints", "render"]


class CheckpointsInputError(ValueError):
    """The run cannot be read; the message says why and what to do."""


@dataclass(slots=True)
class Checkpoints:
    run: Path
    ledger: checkpoint_ledger.Ledger
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "run": str(self.run),
            "saves": [_save_json(save) for save in self.ledger.saves],
            "loads": [asdict(record) for record in self.ledger.loads],
            "loops": [asdict(record) for record in self.ledger.loops],
            "alarms": [
                {"step": f.step, "rank": f.rank, "what": f.what, **asdict(f.alarm)} for f in self.ledger.alarms()
            ],
            "warnings": self.warnings,
        }


def _save_json(save: checkpoint_ledger.Save) -> dict[str, Any]:
    return {
        "step": save.step,
        "rank": save.rank,
        "path": save.path,
        "began": None if save.began is None else save.began.time,
        "saved": None if save.saved is None else asdict(save.saved),
        "alarms": [asdict(alarm) for alarm in save.alarms],
        "gone": save.gone,
    }


def read_checkpoints(run: Path) -> Checkpoints:
    """The ledger's records of this run, read back (see the module docstring)."""
    evidence = Evidence.of_folder(run, CheckpointsInputError)
    return _of(evidence, needed=True)


def _of(evidence: Evidence, *, needed: bool) -> Checkpoints:
    path = checkpoint_record.checkpoint_log_path(evidence.run)
    if needed and not path.exists():
        raise CheckpointsInputError(
            f"{evidence.run} has no {checkpoint_record.CHECKPOINT_LOG}: no checkpoint observer watched this run; add "
            "'- name: checkpoint' to its observers (docs/checkpoints.md)"
        )
    error = CheckpointsInputError if needed else None
    records = evidence.records(path, checkpoint_record.CheckpointRecord, error)
    if needed and not records:
        skipped = f" ({evidence.warnings[0]})" if evidence.warnings else ""
        raise CheckpointsInputError(
            f"{path} holds no checkpoint record of run {evidence.run_id or evidence.run}: no save, load or "
            f"trainer loop's end was written{skipped}"
        )
    return Checkpoints(evidence.run, checkpoint_ledger.read_ledger(records), evidence.warnings)


def render(read: Checkpoints) -> str:
    ledger = read.ledger
    alarms = ledger.alarms()
    lines = [
        f"run {read.run}: {_saves_phrase(ledger.saves)}, {len(ledger.loads)} load(s); "
        f"{len(alarms) or 'no'} alarm{'' if len(alarms) == 1 else 's'}"
    ]
    if ledger.saves:
        lines += ["", f"{'step':>4}  {'rank':>4}  {'tensors':>7}  {'MB':>8}  {'updates':>7}  saved to, alarms"]
        for save in ledger.saves:
            saved = save.saved
            tensors = sum(p["tensors"] for p in saved.parts.values()) if saved else 0
            size = sum(f["bytes"] or 0 for f in saved.files) / 1e6 if saved else 0.0
            updates = "-" if saved is None or saved.updates is None else str(saved.updates)
            kinds = ", ".join(alarm.kind for alarm in save.alarms) or "-"
            lines.append(
                f"{_step(save.step):>4}  {save.rank:>4}  {tensors:>7}  {size:>8.1f}  {updates:>7}  "
                f"{save.path or '?'}: {kinds}"
            )
    if ledger.loads:
        lines += ["", "loads:"]
        for load in ledger.loads:
            kinds = ", ".join(alarm.kind for alarm in load.alarms)
            if not load.compared:  # no manifest, or one with no tensor (a writer the taps do not see)
                compared, kinds = "nothing to compare", kinds or "unchecked"
            else:
                compared, kinds = f"{load.compared} tensor(s) compared", kinds or "restored"
            lines.append(f"  step {_step(load.step)}, {rank_name(load.rank)}: {load.path or '?'}: {compared}: {kinds}")
    for loop in ledger.loops:
        since = f"resumed from step {loop.resumed_from}" if loop.resumed_from else "started fresh"
        asked = f" of total_training_steps={loop.total_steps}" if loop.total_steps is not None else ""
        lines += ["", f"the trainer's loop ({rank_name(loop.rank)}): {since}, last step {_step(loop.last_step)}{asked}"]
    if alarms:
        lines += ["", "alarms:"]
        for step, rank, what, alarm in ((f.step, f.rank, f.what, f.alarm) for f in alarms):
            part = f" ({alarm.part})" if alarm.part else ""
            lines.append(f"  step {_step(step)}, {rank_name(rank)}, {what}: {alarm.kind}{part}: {alarm.detail}")
            shown = alarm.tensors[:5]
            if shown:
                more = f" and {alarm.count - len(shown)} more" if alarm.count > len(shown) else ""
                lines.append(f"    tensors: {', '.join(shown)}{more}")
    return "\n".join(lines)


def _saves_phrase(saves: list[checkpoint_ledger.Save]) -> str:
    if not saves:
        return "no save"
    steps = sorted({s.step for s in saves if s.step is not None})
    span = "" if not steps else f", step {steps[0]}" if len(steps) == 1 else f", steps {steps[0]}-{steps[-1]}"
    return f"{len(saves)} save(s) on {len({s.rank for s in saves})} rank(s){span}"


def _step(step: int | None) -> str:
    return "?" if step is None else str(step)


def headline(evidence: Evidence, holding: Holding) -> str:
    """The checkpoint observer's line in ``verl-events diagnose``: saves, loads, alarms."""
    # diagnose's evidence has read the ledger already: reading it again would warn twice.
    ledger = evidence.checkpoints if evidence.checkpoints is not None else _of(evidence, needed=False).ledger
    alarms = ledger.alarms()
    kinds = sorted({found.alarm.kind for found in alarms})
    said = f"{len(alarms)} alarm(s): {', '.join(kinds)}" if alarms else "no alarm"
    ranks = len({s.rank for s in ledger.saves} | {r.rank for r in ledger.loads})
    return f"{len(ledger.saves)} checkpoint save(s), {len(ledger.loads)} load(s) on {ranks} rank(s): {said}"


#: The command's line in ``verl-events --help``; the other, what RUN is.
HELP = (
    "every checkpoint save and load: what each rank saved, whether the resume restored it, whether the "
    "resumed run trained (exit 0 no alarm, 1 an alarm, 2 bad input)"
)
RUN_HELP = f"the run's save_path (holding {checkpoint_record.CHECKPOINT_LOG})"


def add_command(commands: Any) -> None:
    """Add ``checkpoints`` to the ``verl-events`` parser's subcommands."""
    shell.add_run_command(commands, "checkpoints", command, help=HELP, run=RUN_HELP)


def command(args: Any) -> int:
    """``verl-events checkpoints RUN [--json]``; the exit code (see the module docstring)."""
    return shell.run(
        args,
        lambda: read_checkpoints(Path(args.run)),
        CheckpointsInputError,
        text=render,
        as_json=lambda read: read.as_json(),
        exit_code=lambda read: 1 if read.ledger.alarms() else 0,
        warnings=lambda read: read.warnings,
        allow_nan=False,
    )
