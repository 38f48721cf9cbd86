"""Ranks that Ray's memory monitor killed, told from Ray's own report.

Ray's memory monitor kills a worker from outside, with SIGKILL, when its node runs low
(``RAY_memory_usage_threshold``).  The worker writes nothing; the watchdog sees a rank that
stopped beating (``killed``).  Ray's report, parsed by
:func:`~verl_events.observers.memory.oom.ray_memory_kills`, is raised at the worker's caller
as ``ray.exceptions.OutOfMemoryError``.  It names the node's used and limit figures and,
for each worker it killed, the pid.  diagnose looks for it in:

* every failure's detail: the driver's error in ``crashes/ends.jsonl``, when the driver runs
  the watchdog.  That detail is cut to 500 characters, so it keeps the node's figures but
  usually not the pids;
* the driver's output: ``RUN/trainer.log`` (where ``verl-events demo`` puts verl's), and
  every file passed with ``--log``.

Each killed pid is matched to a rank of the run; memory records and heartbeats carry pids.

* A rank with that pid that died without a word (``killed``, or a launcher's signal)
  becomes ``oom``: *killed by Ray's memory monitor*, with the node's figures, Ray's figure
  for the process, and the rank's last memory record.
* A rank with that pid and no failure (no watchdog ran) gets an ``oom`` failure at its last
  memory record. Where it was after that is unknown.
* Several ranks with that pid (on other hosts) are each *perhaps* killed by it.
* A pid that no record names is a failure of a process without a rank.
* A report without pids (cut short) makes each ``killed`` rank *perhaps* killed by Ray's
  memory monitor.  diagnose then says to pass the driver's output.

Nothing else is read as Ray's memory monitor: an ``ActorDiedError``, a kernel OOM kill and
any other SIGKILL do not carry the report's words.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from verl_events.layout import DRIVER_LOG, open_regular
from verl_events.observers.memory import record as memory_record
from verl_events.observers.memory.oom import RAY_REPORT_WORDS, RayKilledWorker, RayMemoryKill, ray_memory_kills

from .record import LAUNCHER_SIGNALS, NO_RANK, Evidence, Failure, records_of, relative

__all__ = ["DRIVER_LOG", "driver_logs", "ray_kills"]

#: Lines of a log kept after a report's first line: Ray's object-store table and its list
#: of killed workers (one line each) come well within this.
_REPORT_LINES = 200


@dataclass(frozen=True, slots=True)
class _Seen:
    """A report, where it was read and when (the failure's time, or the log's)."""

    report: RayMemoryKill
    source: str
    time: float


def ray_kills(evidence: Evidence, logs: Sequence[Path] = ()) -> None:
    """Name the ranks Ray's memory monitor killed (see the module docstring); ``logs`` are
    the driver's output files to read besides the failures' details and ``RUN/trainer.log``."""
    seen = [*_in_failures(evidence)]
    for path in driver_logs(evidence.run, logs):
        seen += _in_log(evidence, path)
    if not seen:
        return
    killed: dict[int, tuple[RayKilledWorker, _Seen]] = {}
    for sighting in seen:
        for worker in sighting.report.killed:
            killed.setdefault(worker.pid, (worker, sighting))
    if not killed:
        _perhaps_all(evidence, seen[0])
        return
    last = _last_by_pid(evidence)
    ranks: dict[int, set[int]] = {}
    for pid, record in last.items():
        ranks.setdefault(pid, set()).add(record.rank)
    for beat in evidence.heartbeats:
        if beat.pid is not None:
            ranks.setdefault(beat.pid, set()).add(beat.rank)
    for pid, (worker, sighting) in killed.items():
        found = sorted(ranks.get(pid, ()))
        if len(found) == 1:
            _name(evidence, found[0], worker, sighting, last.get(pid))
        elif found:
            _perhaps(evidence, found, worker, sighting)
        else:
            _unknown_pid(evidence, worker, sighting)


def driver_logs(run: Path, logs: Sequence[Path]) -> list[Path]:
    """``logs``, with ``run/trainer.log`` first when it is there and not among them."""
    default = run / DRIVER_LOG
    if not default.is_file() or default.resolve() in {path.resolve() for path in logs}:
        return [*logs]
    return [default, *logs]


def _in_failures(evidence: Evidence) -> list[_Seen]:
    return [
        _Seen(report, failure.source, failure.time)
        for failure in evidence.failures
        if RAY_REPORT_WORDS in failure.detail
        for report in ray_memory_kills(failure.detail)
    ]


def _in_log(evidence: Evidence, path: Path) -> list[_Seen]:
    """The reports in the log ``path``, read a line at a time: a driver's log can be large,
    and only the lines after a report's first are kept."""
    blocks: list[list[str]] = []
    try:
        with io.TextIOWrapper(open_regular(path), encoding="utf-8", errors="replace") as log:
            for line in log:
                if RAY_REPORT_WORDS in line:
                    blocks.append([line])
                elif blocks and len(blocks[-1]) <= _REPORT_LINES:
                    blocks[-1].append(line)
        written = path.stat().st_mtime
    except OSError as exc:
        evidence.warnings.append(f"{path} cannot be read: {exc}")
        return []
    source = relative(evidence, path)
    return [_Seen(report, source, written) for block in blocks for report in ray_memory_kills("".join(block))]


def _last_by_pid(evidence: Evidence) -> dict[int, Any]:
    """Each process's last memory record, by pid."""
    last: dict[int, Any] = {}
    for path in evidence.files(memory_record.memory_files):
        for _, record in records_of(evidence, path, memory_record.MemoryRecord):
            if record.pid not in last or record.time >= last[record.pid].time:
                last[record.pid] = record
    return last


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def _size(nbytes: int) -> str:
    return _gib(nbytes) if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _node(report: RayMemoryKill) -> str:
    threshold = f" (threshold {_gib(report.threshold_bytes)})" if report.threshold_bytes else ""
    return f"node {report.node_ip} at {_gib(report.used_bytes)} used / {_gib(report.limit_bytes)} limit{threshold}"


def _held(record: Any) -> str:
    """What the process held at its last memory record."""
    if record is None or record.host_end_bytes is None:
        return ""
    held = f"; at the end of {record.stage} (step {record.step}) it held {_size(record.host_end_bytes)}"
    if record.host_peak_bytes is not None:
        held += f", {_size(record.host_peak_bytes)} at its peak"
    limit = (record.cgroup or {}).get("limit_bytes")
    return held + (f" (cgroup limit {_size(limit)})" if limit else "")


def _said(worker: RayKilledWorker, sighting: _Seen, record: Any) -> str:
    return (
        f"killed by Ray's memory monitor ({sighting.source}): {_node(sighting.report)}, "
        f"this process at {_gib(worker.used_bytes)} by Ray's count{_held(record)}"
    )


def _died_silently(failure: Failure, rank: int, pid: int) -> bool:
    silent = failure.kind == "killed" or (failure.kind == "signal" and failure.detail in LAUNCHER_SIGNALS)
    return silent and failure.rank == rank and failure.pid in (pid, None)


def _name(evidence: Evidence, rank: int, worker: RayKilledWorker, sighting: _Seen, record: Any) -> None:
    said = _said(worker, sighting, record)
    named = False
    for index, failure in enumerate(evidence.failures):
        if _died_silently(failure, rank, worker.pid):
            evidence.failures[index] = replace(failure, kind="oom", detail=f"{said} — {failure.detail}")
            named = True
    if named or record is None:
        return
    evidence.failures.append(
        Failure(
            "oom",
            rank,
            record.time,
            f"{said}; no watchdog ran, so where it was after that record is unknown",
            record.step,
            record.stage,
            pid=worker.pid,
            source=relative(evidence, memory_record.memory_log_path(evidence.run, rank)),
            in_stage=None,
        )
    )


def _perhaps(evidence: Evidence, ranks: list[int], worker: RayKilledWorker, sighting: _Seen) -> None:
    """A pid that several ranks had, on different hosts: Ray's report names a node by its IP,
    the records name none."""
    who = " and ".join(map(str, ranks))
    said = (
        f"perhaps killed by Ray's memory monitor ({sighting.source}): it killed pid {worker.pid} on "
        f"node {sighting.report.node_ip}, and ranks {who} had that pid on their hosts"
    )
    for index, failure in enumerate(evidence.failures):
        if any(_died_silently(failure, rank, worker.pid) for rank in ranks):
            evidence.failures[index] = replace(failure, detail=f"{said} — {failure.detail}")


def _unknown_pid(evidence: Evidence, worker: RayKilledWorker, sighting: _Seen) -> None:
    task = f" (task {worker.task})" if worker.task else ""
    evidence.failures.append(
        Failure(
            "oom",
            NO_RANK,
            sighting.time,
            f"Ray's memory monitor killed pid {worker.pid}{task}, which no rank of this run's records had: "
            f"{_node(sighting.report)}, that process at {_gib(worker.used_bytes)} by Ray's count",
            pid=worker.pid,
            source=sighting.source,
            in_stage=False,
        )
    )


def _perhaps_all(evidence: Evidence, sighting: _Seen) -> None:
    """A report whose pids were cut off: every rank that died without a word may be one."""
    report = sighting.report
    said = (
        f"perhaps killed by Ray's memory monitor: {sighting.source} says {report.workers} worker(s) were killed "
        f"({_node(report)}) but names no pid there; pass the driver's output (diagnose --log FILE) to tell which"
    )
    for index, failure in enumerate(evidence.failures):
        if failure.kind == "killed":
            evidence.failures[index] = replace(failure, detail=f"{said} — {failure.detail}")
