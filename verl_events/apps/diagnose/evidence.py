"""Every failure a run folder holds, whichever tool wrote it, as one kind of record.

* the watchdog's crash records (:mod:`~verl_events.observers.watchdog.crash`):
  a stage that raised (``exception``), a terminating signal (``signal``);
* its fatal dumps: a segfault's or an abort's stacks (``signal``, timed by
  the file);
* its heartbeats: a rank that stopped beating without closing and left no
  record of why (``killed``: SIGKILL leaves nothing else), or that closed
  after an exception outside any stage;
* ``hangs.jsonl``: a stage past its deadline (``hang``);
* the timing logs: a stage that raised on a rank the watchdog did not watch;
* the sentinel's ``anomalies.jsonl`` (``anomaly``);
* the weight_sync observer's ledger: each alarm of a sync (``anomaly``, at
  stage ``update_weights``).

Each reader skips what it cannot read with a sentence in ``warnings``, and
records of another run (their ``run`` is not the folder's, from
``run.json``) likewise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_events.layout import owner_of

from ..formats import anomaly_record, hang_record, timing_log, weight_sync_record
from .deaths import crash_records, fatal_dumps, process_ends, read_heartbeats, stopped_ranks, teardown
from .record import LAUNCHER_SIGNALS, Evidence, Failure, records_of, relative

__all__ = ["LAUNCHER_SIGNALS", "Evidence", "Failure", "gather"]


def gather(run: Path) -> Evidence:
    """Read every failure under ``run`` (see the module docstring)."""
    evidence = Evidence(run, owner_of(run))
    read_heartbeats(evidence)
    process_ends(evidence)
    crash_records(evidence)
    fatal_dumps(evidence)
    stopped_ranks(evidence)
    teardown(evidence)
    _hangs(evidence)
    _timing(evidence)
    _anomalies(evidence)
    _weight_alarms(evidence)
    return evidence


def _hangs(evidence: Evidence) -> None:
    path = hang_record.hangs_log_path(evidence.run)
    for _, record in records_of(evidence, path, hang_record.HangRecord.from_json):
        if record.kind == "late":
            evidence.late_records += 1
            continue
        evidence.hang_records += 1
        waiting = f", waiting in {record.waiting_in}" if record.waiting_in else ""
        evidence.failures.append(
            Failure(
                "hang",
                record.rank,
                record.time,
                f"passed its deadline of {record.deadline_s:g} s ({record.deadline}){waiting}",
                record.step,
                record.stage,
                record.host,
                record.pid,
                record.where,
                relative(evidence, path),
                waiting_in=record.waiting_in,
            )
        )


def _timing(evidence: Evidence) -> None:
    """Stages that raised, from the timing logs, where no crash record says so already."""
    recorded = {(f.rank, f.step, f.stage) for f in evidence.failures if f.kind == "exception"}
    found: dict[tuple[int, int | None, str | None, str | None], Any] = {}
    files = timing_log.timing_log_files(evidence.run)
    evidence.timing_ranks = len(files)
    for path in files:
        for _, record in records_of(evidence, path, timing_log.TimingRecord.from_json):
            evidence.timing_records += 1
            evidence.timing.append(record)
            if record.error is None:
                continue
            evidence.timing_errors += 1
            # The exception leaves every enclosing stage too: keep the innermost.
            key = (record.rank, record.step, record.error, record.message)
            if key not in found or record.depth > found[key][0].depth:
                found[key] = (record, path)
    for record, path in found.values():
        if (record.rank, record.step, record.stage) in recorded:
            continue
        message = record.message
        evidence.failures.append(
            Failure(
                "exception",
                record.rank,
                record.end_unix or 0.0,
                f"{record.error}: {message}" if message is not None else str(record.error),
                record.step,
                record.stage,
                source=relative(evidence, path),
                message=message,
            )
        )


def _anomalies(evidence: Evidence) -> None:
    path = anomaly_record.anomaly_log_path(evidence.run)
    for _, record in records_of(evidence, path, anomaly_record.AnomalyRecord.from_json):
        evidence.failures.append(
            Failure(
                "anomaly",
                record.rank,
                record.time or 0.0,
                record.detail or f"{record.metric} = {record.value} broke rule {record.rule}",
                record.step,
                record.stage,
                source=relative(evidence, path),
            )
        )


def _weight_alarms(evidence: Evidence) -> None:
    path = weight_sync_record.weight_sync_log_path(evidence.run)
    for _, record in records_of(evidence, path, weight_sync_record.SyncRecord.from_json):
        for alarm in record.alarms:
            where = f" ({alarm.layer})" if alarm.layer else ""
            evidence.failures.append(
                Failure(
                    "anomaly",
                    record.rank,
                    record.time,
                    f"weight sync alarm {alarm.kind}{where}: {alarm.detail}",
                    record.step,
                    weight_sync_record.STAGE,
                    source=relative(evidence, path),
                )
            )
