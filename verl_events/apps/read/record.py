"""What every command reads a run into (:class:`Evidence`): one kind of record for every
failure, and the readers' helpers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_events.layout import owner_of
from verl_events.observers.watchdog import record as hang_record

from .jsonl import read_records

__all__ = [
    "LAUNCHER_SIGNALS",
    "NO_RANK",
    "Evidence",
    "Failure",
    "not_a_folder",
    "of_this_run",
    "records_of",
    "relative",
]


#: Signals a launcher sends to end a job's processes.
LAUNCHER_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
#: The rank of a failure of a process that holds none: verl's ``main_ppo`` (Ray's driver
#: process), a launcher, a pid no record names.  verl's driver, where the trainer's loop runs,
#: has a rank of its own (:data:`verl_events.DRIVER_RANK`, -1); both are below every trainer rank.
NO_RANK = -2


@dataclass(frozen=True, slots=True)
class Failure:
    """One rank's failure.  ``time`` is when it happened (Unix seconds); for
    ``killed``, the last heartbeat (it died within one liveness beat after)."""

    kind: str  # exception, oom, signal, killed, hang, stall, anomaly, slow
    rank: int  # a trainer rank, DRIVER_RANK, or NO_RANK
    time: float
    detail: str
    step: int | None = None
    stage: str | None = None
    host: str | None = None
    pid: int | None = None
    where: dict[str, Any] | None = None
    source: str = ""  # the file it was read from, relative to the run
    message: str | None = None  # an exception's message, for telling a consequence
    waiting_in: str | None = None  # a hang: the torch.distributed call it waits in
    in_stage: bool | None = True  # False: between stages (step and stage: the last that ended); None: unknown
    parent: str | None = None  # the stage enclosing ``stage``
    window: float = 0.0  # killed: it died within this many seconds after ``time``
    since: float | None = None  # stall: when its idle time began
    outlived: str | None = None  # killed: what its task raised (and where) that shows it outlived a failure

    @classmethod
    def told_by(cls, record: Any, kind: str, detail: str, source: str, **more: Any) -> Failure:
        """The failure a crash or hang record tells of: its rank, time, step, stage, host,
        pid and where, with what the reader says of it."""
        where, step, stage = record.where, record.step, record.stage
        return cls(kind, record.rank, record.time, detail, step, stage, record.host, record.pid, where, source, **more)

    def as_json(self) -> dict[str, Any]:
        keys = ("rank", "host", "pid", "step", "stage", "parent", "kind", "detail", "where", "time", "source")
        return {key: getattr(self, key) for key in keys}


@dataclass(slots=True)
class Evidence:
    """What :func:`gather` found in a run folder."""

    run: Path
    run_id: str | None
    failures: list[Failure] = field(default_factory=list)
    heartbeats: list[hang_record.Heartbeat] = field(default_factory=list)
    hang_records: int = 0
    late_records: int = 0
    hangs: list[Any] = field(default_factory=list)  # hangs.jsonl's records
    stalls: list[Any] = field(default_factory=list)  # stalls.Stall, each stall line read against the others
    checkpoints: Any = None  # the checkpoint ledger (observers.checkpoint.ledger.Ledger), once read
    ends: list[Any] = field(default_factory=list)  # crash.ProcessEnd, one per process that said how it ended
    teardown: list[Failure] = field(default_factory=list)  # launcher signals after the driver ended normally
    timing_records: int = 0
    timing: list[Any] = field(default_factory=list)  # the timing logs' records, for the stragglers
    timing_ranks: int = 0  # the trainer ranks with a timing log
    timing_driver: bool = False  # whether verl's driver has one
    timing_errors: int = 0
    timing_tails_of: int = 0  # the timing logs' bytes, when only their ends were read (a large run)
    read_all: bool = False  # read every line of a large run's logs (diagnose --read-all)
    read_in_part: list[str] = field(default_factory=list)  # the logs read in part, with how
    warnings: list[str] = field(default_factory=list)
    now: float = field(default_factory=time.time)
    found: dict[Callable[[Path], list[Path]], list[Path]] = field(default_factory=dict, repr=False)

    @classmethod
    def of_folder(cls, run: Path, input_error: type[Exception]) -> Evidence:
        """The evidence of the run folder ``run`` with nothing read yet, for a command to read
        what it needs into; ``input_error`` (the command's) when ``run`` is not a folder."""
        if not run.is_dir():
            raise input_error(not_a_folder(run))
        return cls(run, owner_of(run))

    def records(self, path: Path, record_class: Any, needed: type[Exception] | None = None) -> list[Any]:
        """Every record of this run in the JSON-lines log ``path`` (:func:`records_of`); a
        command that cannot do without the log passes its input error as ``needed``."""
        return [record for _, record in records_of(self, path, record_class, needed)]

    def files(self, finder: Callable[[Path], list[Path]]) -> list[Path]:
        """``finder(run)``: a kind of file under the run, globbed once however many readers
        (and the tool lines of diagnose) ask."""
        if finder not in self.found:
            self.found[finder] = finder(self.run)
        return self.found[finder]


def not_a_folder(run: Path) -> str:
    """What every command says of a RUN that is no folder."""
    return f"{run} {'is not a directory' if run.exists() else 'does not exist'}; pass the save_path of a run"


def relative(evidence: Evidence, path: Path) -> str:
    try:
        return path.relative_to(evidence.run).as_posix()
    except ValueError:
        return str(path)


def of_this_run(evidence: Evidence, run: str | None, where: str) -> bool:
    if evidence.run_id is None or run is None or run == evidence.run_id:
        return True
    evidence.warnings.append(
        f"{where} was skipped: it belongs to run {run!r}, and this folder to run {evidence.run_id!r}"
    )
    return False


def records_of(
    evidence: Evidence, path: Path, record_class: Any, needed: type[Exception] | None = None
) -> Iterator[tuple[int, Any]]:
    """Each record of the JSON-lines log ``path`` of this run (the shared reader,
    :func:`~verl_events.apps.read.jsonl.read_records`), with its line number; an unreadable
    log (unless ``needed``: then that error), a line that is not a record and a record of
    another run are warnings."""
    for number, record in read_records(path, record_class, evidence.warnings, needed):
        if of_this_run(evidence, getattr(record, "run", None), f"{path}:{number}"):
            yield number, record
