"""``verl-events weights RUN``: every weight sync of a run, what changed, what the engine holds, the alarms.

Reads the ``weight_sync`` observer's ledger (``weight_sync.jsonl``, format
owner :mod:`verl_events.observers.weight_sync.record`): one row per sync and
rank, then each alarm with the tensors and the layer it names, and each sync
that could not be checked with the reason its line gives.  ``--json``
prints ``{"run", "syncs": [{"step", "rank", "tensors", "changed",
"optimizer_stepped", "receipt", "alarms": [{"kind", "tensors", "layer",
"detail"}], ...}], "warnings"}``.

A line that is not a record (cut short by a process that died while writing
it) and a record of another run (its ``run`` is not the folder's, from
``run.json``) are skipped with a warning.

With no ledger, the timing logs say whether the observer was on: each stage
record names the observers that received it.  The observer on and no
``update_weights`` stage ever reaching it is no sync to check (exit 0, said
so); ``update_weights`` stages that ran on ranks where it was not are syncs
nobody checked (exit 1); neither seen is bad input.

Exit codes: 0 no alarm, 1 an alarm (or syncs that ran unwatched), 2 bad input
(no such folder; no ledger and nothing showing the observer on; no record of
this run in the ledger).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verl_events.observers import timing as timing_log
from verl_events.observers.weight_sync import record as weight_sync_record

from . import shell
from .read.record import Evidence

__all__ = ["NoSyncSeen", "WeightsInputError", "add_command", "command", "read_syncs"]


class WeightsInputError(ValueError):
    """The run cannot be read; the message says why and what to do."""


#: The observer's name in the timing records' ``observers`` (the registry's name for it).
OBSERVER = "weight_sync"
STAGE = "update_weights"


class NoSyncSeen(Exception):
    """No ledger, though the timing logs show the observer on: ``sentence`` says what they
    show, ``unwatched`` the ``update_weights`` stages that ran where it was not."""

    def __init__(self, run: Path, received: int, unwatched: list[tuple[int, int | None]]) -> None:
        self.run, self.received, self.unwatched = run, received, unwatched
        said = f"the {OBSERVER} observer was on (it received {received} stage(s), by the timing logs)"
        if unwatched:
            where = ", ".join(f"rank {rank} step {step}" for rank, step in unwatched[:8])
            more = f" and {len(unwatched) - 8} more" if len(unwatched) > 8 else ""
            said += (
                f", but {len(unwatched)} {STAGE} stage(s) ran where it did not watch ({where}{more}): "
                "nothing of those syncs was checked; widen its selection (stages, ranks, steps)"
            )
        else:
            said += f" and no {STAGE} stage reached it: no weight sync ran where it watched"
        super().__init__(said)

    def as_json(self) -> dict[str, Any]:
        unwatched = [{"rank": rank, "step": step} for rank, step in self.unwatched]
        return {"run": str(self.run), "syncs": [], "received": self.received, "unwatched": unwatched, "warnings": []}


@dataclass(slots=True)
class Syncs:
    run: Path
    records: list[Any]  # weight_sync_record.SyncRecord, by step then rank
    warnings: list[str] = field(default_factory=list)

    @property
    def alarms(self) -> list[tuple[Any, Any]]:
        """(record, alarm) for every alarm, in step and rank order."""
        return [(record, alarm) for record in self.records for alarm in record.alarms]

    def as_json(self) -> dict[str, Any]:
        return {
            "run": str(self.run),
            "syncs": [asdict(record) for record in self.records],
            "warnings": self.warnings,
        }


def read_syncs(run: Path) -> Syncs:
    """The ledger's records of this run (see the module docstring)."""
    evidence = Evidence.of_folder(run, WeightsInputError)
    path = weight_sync_record.weight_sync_log_path(run)
    records = evidence.records(path, weight_sync_record.SyncRecord, WeightsInputError)
    if not records and not evidence.warnings:
        _without_ledger(evidence)  # no ledger, or an empty one
    if not records:
        raise WeightsInputError(
            f"{path} holds no sync of run {evidence.run_id or run}: every line was skipped ({evidence.warnings[0]})"
        )
    records.sort(key=lambda r: (r.step if r.step is not None else -1, r.rank, r.time))
    return Syncs(run, records, evidence.warnings)


def _without_ledger(evidence: Evidence) -> None:
    """NoSyncSeen when the timing logs show the observer on, else WeightsInputError."""
    run, received, unwatched = evidence.run, 0, []
    logs = evidence.files(timing_log.timing_log_files)
    for path in logs:
        for record in evidence.records(path, timing_log.TimingRecord):
            watched = isinstance(record.observers, (list, tuple)) and OBSERVER in record.observers
            received += watched
            if record.stage == STAGE and not watched:
                unwatched.append((record.rank, record.step))
    if received:
        raise NoSyncSeen(run, received, unwatched)
    seen = (
        f"and no stage of its {len(logs)} timing log(s) reached a {OBSERVER} observer"
        if logs
        else "and no timing log says which observers were on"
    )
    raise WeightsInputError(
        f"{run} has no {weight_sync_record.WEIGHT_SYNC_LOG} {seen}: no {OBSERVER} observer watched this run; "
        f"add '- name: {OBSERVER}' to its observers (docs/weight-sync.md)"
    )


def render(syncs: Syncs) -> str:
    records = syncs.records
    ranks = len({r.rank for r in records})
    steps = [r.step for r in records if r.step is not None]
    span = f"steps {min(steps)}-{max(steps)}" if steps else "steps unknown"
    alarms = syncs.alarms
    unchecked = [r for r in records if r.unchecked]
    lines = [
        f"run {syncs.run}: {len(records)} sync(s) on {ranks} rank(s), {span}; "
        f"{len(alarms) or 'no'} alarm{'' if len(alarms) == 1 else 's'}"
        + (f"; {len(unchecked)} unchecked" if unchecked else ""),
        "",
        f"{'step':>4}  {'rank':>4}  {'tensors':>7}  {'MB':>8}  {'changed':>7}  {'stepped':>7}  {'receipt':<22}  alarms",
    ]
    for r in records:
        changed = "-" if r.changed is None else str(r.changed)
        stepped = {True: "yes", False: "no", None: "?"}[r.optimizer_stepped]
        kinds = ", ".join(alarm.kind for alarm in r.alarms) or "-"
        lines.append(
            f"{_step(r.step):>4}  {r.rank:>4}  {r.tensors:>7}  {r.bytes / 1e6:>8.1f}  {changed:>7}  "
            f"{stepped:>7}  {'unchecked' if r.unchecked else _receipt(r.receipt):<22}  {kinds}"
        )
    if unchecked:
        lines += ["", "unchecked (nothing of these syncs was seen, so nothing is known about them):"]
        by_reason: dict[str, list[str]] = {}
        for r in unchecked:
            by_reason.setdefault(r.unchecked, []).append(f"step {_step(r.step)} rank {r.rank}")
        lines += [f"  {', '.join(where)}: {why}" for why, where in by_reason.items()]
    if alarms:
        lines += ["", "alarms:"]
        for record, alarm in alarms:
            where = f" ({alarm.layer})" if alarm.layer else ""
            lines.append(f"  step {_step(record.step)}, rank {record.rank}: {alarm.kind}{where}: {alarm.detail}")
            shown = alarm.tensors[:5]
            if shown and alarm.count < record.tensors:  # the whole payload: no list says more
                more = f" and {alarm.count - len(shown)} more" if alarm.count > len(shown) else ""
                lines.append(f"    tensors: {', '.join(shown)}{more}")
    return "\n".join(lines)


def _step(step: int | None) -> str:
    return "?" if step is None else str(step)


def _receipt(receipt: dict[str, Any] | None) -> str:
    if receipt is None:
        return "none"
    wrong = sum(len(receipt.get(key) or ()) for key in ("missing", "differs", "not_updated"))
    if wrong:
        return f"{wrong} wrong of {receipt['tensors']}"
    how = "bytes match" if receipt.get("same_dtype", True) else "changes match"
    return f"{receipt['tensors']} held, {how}"


#: The command's line in ``verl-events --help``; the other, what RUN is.
HELP = (
    "every weight sync: what was sent, what changed, what the engine holds, the alarms "
    "(exit 0 none, 1 an alarm, 2 bad input)"
)
RUN_HELP = f"the run's save_path (holding {weight_sync_record.WEIGHT_SYNC_LOG})"


def add_command(commands: Any) -> None:
    """Add ``weights`` to the ``verl-events`` parser's subcommands."""
    shell.add_run_command(commands, "weights", command, help=HELP, run=RUN_HELP)


def command(args: Any) -> int:
    """``verl-events weights RUN [--json]``; the exit code (see the module docstring)."""
    return shell.run(
        args,
        lambda: _syncs_or_none_seen(Path(args.run)),
        WeightsInputError,
        text=lambda read: render(read) if isinstance(read, Syncs) else f"run {read.run}: {read}",
        as_json=lambda read: read.as_json(),
        exit_code=lambda read: 1 if (read.alarms if isinstance(read, Syncs) else read.unwatched) else 0,
        warnings=lambda read: read.warnings if isinstance(read, Syncs) else [],
        allow_nan=False,
    )


def _syncs_or_none_seen(run: Path) -> Syncs | NoSyncSeen:
    """The ledger's syncs, or what the timing logs say when there is no ledger (not an error)."""
    try:
        return read_syncs(run)
    except NoSyncSeen as nothing:
        return nothing
