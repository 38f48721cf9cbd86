"""Every failure a run folder holds, whichever tool wrote it, as one kind of record.

* the watchdog's crash records (:mod:`~verl_events.observers.watchdog.crash`):
  a stage that raised (``exception``), a terminating signal (``signal``);
* its fatal dumps: a segfault's or an abort's stacks (``signal``, timed by
  the file);
* its heartbeats: a rank that stopped beating without closing and left no
  record of why (``killed``: SIGKILL leaves nothing else), or that closed
  after an exception outside any stage;
* ``hangs.jsonl``: a stage past its deadline (``hang``);
* ``stalls.jsonl``: a process with no stage open past its deadline, read
  against the other ranks' stages (:mod:`..stalls`): ``stall`` when nothing
  else was in progress and it never resumed, ``slow`` when it resumed, and
  nothing when it waited on another rank's stage;
* the timing logs: a stage that raised on a rank the watchdog did not watch;
* the sentinel's ``anomalies.jsonl`` (``anomaly``);
* the weight_sync observer's ledger: each alarm of a sync (``anomaly``, at
  stage ``update_weights``);
* the checkpoint observer's ledger: each alarm of a save, a load or the trainer
  loop's end (``anomaly``), a save that never finished included.

An exception that is an out-of-memory error (torch's CPU, CUDA or NPU
allocator, Python's ``MemoryError``) becomes ``oom``, with the bytes it asked
for and, where the memory observer ran, what the process held when the
stage began and at its peak, and its cgroup's limit.  A ``killed`` rank (it
stopped beating without a word: SIGKILL) is said to be *most likely killed by
the OOM killer* when the memory observer's last record of it stood at 90 % or
more of its cgroup's limit, or when that cgroup (read now, where diagnose
runs and the cgroup still exists) counts more OOM kills than the record did.
A rank that Ray's memory monitor killed is ``oom``, named by the pid in Ray's
report (:mod:`.ray_kills`), read from the failures and from the driver's
output (``RUN/trainer.log``, ``--log``).

Each reader skips what it cannot read with a sentence in ``warnings``, and
records of another run (their ``run`` is not the folder's, from
``run.json``) likewise.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from verl_events.layout import owner_of
from verl_events.observers import timing as timing_log
from verl_events.observers.checkpoint import ledger as checkpoint_ledger
from verl_events.observers.checkpoint import record as checkpoint_record
from verl_events.observers.memory import record as memory_record
from verl_events.observers.memory.cgroup import read_cgroup
from verl_events.observers.memory.oom import RAY_REPORT_WORDS, OutOfMemory, out_of_memory
from verl_events.observers.sentinel import record as anomaly_record
from verl_events.observers.watchdog import record as hang_record
from verl_events.observers.watchdog import stall_record
from verl_events.observers.weight_sync import record as weight_sync_record

from . import large_logs
from .deaths import crash_records, fatal_dumps, outlived, process_ends, read_heartbeats, stopped_ranks, teardown
from .large_logs import ALARM_LINE, lines_matching, tail_records, total_bytes
from .liveness import liveness, newest
from .ranks import DRIVER_RANK, ranks_phrase
from .ray_kills import ray_kills
from .record import LAUNCHER_SIGNALS, NO_RANK, Evidence, Failure, records_of, relative
from .stalls import read_against

__all__ = ["LAUNCHER_SIGNALS", "Evidence", "Failure", "gather"]


def gather(run: Path, logs: Sequence[Path] = (), *, read_all: bool = False) -> Evidence:
    """Read every failure under ``run`` (see the module docstring); ``logs``: the driver's
    output files, besides ``run/trainer.log``, which is read when it is there.  A large
    run's timing, memory and weight-sync logs are read in part (:mod:`.large_logs`)
    unless ``read_all``."""
    evidence = Evidence(run, owner_of(run), read_all=read_all)
    read_heartbeats(evidence)
    process_ends(evidence)
    crash_records(evidence)
    fatal_dumps(evidence)
    stopped_ranks(evidence)
    teardown(evidence)
    outlived(evidence)
    _hangs(evidence)
    _timing(evidence)
    _stalls(evidence)
    _anomalies(evidence)
    _weight_alarms(evidence)
    _checkpoint_alarms(evidence)
    _out_of_memory(evidence)
    ray_kills(evidence, logs)
    _killed_by_oom(evidence)
    return evidence


def _hangs(evidence: Evidence) -> None:
    """Each stage that passed its deadline: a ``hang``, or, when it ended after all (its
    ``late`` line), ``slow``: a finding, like an anomaly, and no failure."""
    path = hang_record.hangs_log_path(evidence.run)
    records = [record for _, record in records_of(evidence, path, hang_record.HangRecord)]
    evidence.hangs = records
    ended = {(r.rank, r.pid, r.step, r.stage): r for r in records if r.kind == "late"}
    for record in records:
        if record.kind == "late":
            evidence.late_records += 1
            continue
        evidence.hang_records += 1
        deadline = f"passed its deadline of {record.deadline_s:g} s ({record.deadline})"
        late = ended.get((record.rank, record.pid, record.step, record.stage))
        if late is not None:
            kind, detail, waiting_in = "slow", f"{deadline}, then ended after {late.elapsed_s:.1f} s", None
        else:
            waiting = f", waiting in {record.waiting_in}" if record.waiting_in else ""
            kind, detail, waiting_in = "hang", deadline + waiting, record.waiting_in
        source = relative(evidence, path)
        evidence.failures.append(Failure.told_by(record, kind, detail, source, waiting_in=waiting_in))


def _stalls(evidence: Evidence) -> None:
    """Each process with no stage open past its deadline (see the module docstring)."""
    path = stall_record.stalls_log_path(evidence.run)
    records = [record for _, record in records_of(evidence, path, stall_record.StallRecord)]
    evidence.stalls = read_against(records, evidence.timing, evidence.heartbeats, evidence.hangs)
    for stall in evidence.stalls:
        if stall.state == "waiting":
            continue
        record, after = stall.record, stall.record.after or {}
        evidence.failures.append(
            Failure(
                "slow" if stall.state == "resumed" else "stall",
                NO_RANK if stall.rank is None else stall.rank,
                record.time,
                (f"{record.process}: " if stall.rank is None and record.process else "")
                + stall.describe()
                + (f"; stacks: {record.report}" if record.report else ""),
                after.get("step"),
                after.get("stage"),
                record.host,
                record.pid,
                record.where,
                relative(evidence, path),
                waiting_in=record.waiting_in,
                in_stage=False,
                since=record.began,
            )
        )


def _timing(evidence: Evidence) -> None:
    """Stages that raised, from the timing logs, where no crash record says so already."""
    recorded = {(f.rank, f.step, f.stage) for f in evidence.failures if f.kind == "exception"}
    found: dict[tuple[int, int | None, str | None, str | None], Any] = {}
    files = evidence.files(timing_log.timing_log_files)
    driver = timing_log.timing_log_path(evidence.run, DRIVER_RANK)
    evidence.timing_driver = driver in files
    evidence.timing_ranks = len(files) - evidence.timing_driver
    size = total_bytes(files)
    if not evidence.read_all and size > large_logs.FULL_READ_BYTES:
        evidence.timing_tails_of = size
        evidence.read_in_part.append(f"timing logs: the last {large_logs.TAIL_BYTES // 1024} KiB of each")
    for path in files:
        for record in _timing_records(evidence, path):
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


def _timing_records(evidence: Evidence, path: Path) -> Iterator[Any]:
    """A timing log's records: every one, kept for the stragglers, or those near its end
    of a large run (:mod:`.large_logs`)."""
    parse = timing_log.TimingRecord.from_json
    if evidence.timing_tails_of:
        yield from tail_records(evidence, path, parse)
        return
    for _, record in records_of(evidence, path, timing_log.TimingRecord):
        evidence.timing_records += 1
        evidence.timing.append(record)
        yield record


def _anomalies(evidence: Evidence) -> None:
    path = anomaly_record.anomaly_log_path(evidence.run)
    for _, record in records_of(evidence, path, anomaly_record.AnomalyRecord):
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
    parse = weight_sync_record.SyncRecord.from_json
    if not evidence.read_all and total_bytes([path]) > large_logs.FULL_READ_BYTES:
        evidence.read_in_part.append("weight-sync ledger: the lines with an alarm")
        records = lines_matching(evidence, path, ALARM_LINE, parse)
    else:
        records = records_of(evidence, path, weight_sync_record.SyncRecord)
    for _, record in records:
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


def _checkpoint_alarms(evidence: Evidence) -> None:
    """Each alarm of the checkpoint ledger, as an ``anomaly``; but a save with no manifest yet
    on a rank that still beats is one being written, not one cut short."""
    path = checkpoint_record.checkpoint_log_path(evidence.run)
    records = [record for _, record in records_of(evidence, path, checkpoint_record.CheckpointRecord)]
    ledger = evidence.checkpoints = checkpoint_ledger.read_ledger(records)
    last = newest(evidence.heartbeats)
    beating = {b.rank for b in evidence.heartbeats if liveness(b, evidence.now, last).state == "alive"}
    writing = {(save.rank, save.step) for save in ledger.saves if save.saved is None and save.rank in beating}
    stages = {"save": "save_checkpoint", "load": "load_checkpoint", "loop": ""}
    for found in ledger.alarms():
        if found.what == "save" and (found.rank, found.step) in writing:
            continue
        alarm = found.alarm
        part = f" ({alarm.part})" if alarm.part else ""
        evidence.failures.append(
            Failure(
                "anomaly",
                found.rank,
                found.time,
                f"checkpoint alarm {alarm.kind}{part}: {alarm.detail}",
                found.step,
                stages[found.what],
                source=relative(evidence, path),
            )
        )


def _out_of_memory(evidence: Evidence) -> None:
    """Each exception that is an out-of-memory error, as ``oom`` (see the module docstring)."""
    ooms = [
        (i, found)
        for i, f in enumerate(evidence.failures)
        # Ray's memory monitor's report is another process's death, not this one's allocation.
        if f.kind == "exception" and RAY_REPORT_WORDS not in f.detail and (found := out_of_memory(f.detail))
    ]
    if not ooms:
        return
    held = _stages_that_raised(evidence, {evidence.failures[index].rank for index, _ in ooms})
    for index, found in ooms:
        failure = evidence.failures[index]
        figures = held.get((failure.rank, failure.step, failure.stage))
        evidence.failures[index] = replace(failure, kind="oom", detail=_oom_detail(found, figures, failure))


def _stages_that_raised(evidence: Evidence, ranks: set[int]) -> dict[tuple[int, int | None, str | None], Any]:
    """The memory observer's records of stages that raised on ``ranks``, by (rank, step, stage)."""
    found: dict[tuple[int, int | None, str | None], Any] = {}
    for record in _memory_records(evidence, ranks):
        if record.error is not None:
            found[(record.rank, record.step, record.stage)] = record
    return found


def _memory_records(evidence: Evidence, ranks: set[int]) -> Iterator[Any]:
    """The memory observer's records of ``ranks``, read from their own logs: every record,
    or those near each log's end when the memory logs are large (:mod:`.large_logs`)."""
    files = evidence.files(memory_record.memory_files)
    whole = evidence.read_all or total_bytes(files) <= large_logs.FULL_READ_BYTES
    if not whole and ranks:
        evidence.read_in_part.append(
            f"memory logs: the last {large_logs.TAIL_BYTES // 1024} KiB of {ranks_phrase(ranks)}"
        )
    parse = memory_record.MemoryRecord.from_json
    theirs = {memory_record.memory_log_path(evidence.run, rank) for rank in ranks}
    for path in files:
        if path not in theirs:
            continue
        if whole:
            records: Iterator[Any] = (record for _, record in records_of(evidence, path, memory_record.MemoryRecord))
        else:
            records = tail_records(evidence, path, parse)
        yield from (record for record in records if record.rank in ranks)


def _oom_detail(found: OutOfMemory, record: Any, failure: Failure) -> str:
    where = f" ({found.device})" if found.device else ""
    said = [f"out of memory{where}"]
    if found.asked_bytes is not None:
        said.append(f"asked for {_size(found.asked_bytes)}")
    if record is not None and record.host_begin_bytes is not None:
        held = f"the process held {_size(record.host_begin_bytes)} when {record.stage} began"
        if record.host_peak_bytes is not None:
            held += f", {_size(record.host_peak_bytes)} at its peak"
        limit = (record.cgroup or {}).get("limit_bytes")
        said.append(held + (f" (cgroup limit {_size(limit)})" if limit else ""))
        device = record.device or {}
        if device.get("peak_allocated") is not None:
            said.append(f"{device.get('kind')} peak {_size(device['peak_allocated'])} of {_size(device['total'])}")
        for warned in record.forecast or ():
            said.append(
                f"the forecast warned when it began: {_size(warned['expected_bytes'])} more expected for "
                f"{warned['tokens']:,} tokens, {_size(warned['headroom_bytes'])} left ({warned['limit']})"
            )
    return "; ".join(said) + f" — {failure.detail}"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


#: A cgroup's usage at or above this share of its limit stood near it.
NEAR_LIMIT = 0.9


def _killed_by_oom(evidence: Evidence) -> None:
    """Each ``killed`` rank that most likely met the OOM killer (see the module docstring)."""
    killed = [i for i, f in enumerate(evidence.failures) if f.kind == "killed"]
    if not killed:
        return
    last: dict[int, Any] = {}
    for record in _memory_records(evidence, {evidence.failures[index].rank for index in killed}):
        if record.rank not in last or record.time >= last[record.rank].time:
            last[record.rank] = record
    for index in killed:
        failure = evidence.failures[index]
        latest = last.get(failure.rank)
        why = _oom_kill_signs(latest) if latest is not None else None
        if why is not None:
            evidence.failures[index] = replace(
                failure, detail=f"most likely killed by the OOM killer: {why} — {failure.detail}"
            )


def _oom_kill_signs(record: Any) -> str | None:
    cgroup = record.cgroup or {}
    limit, usage, counted = cgroup.get("limit_bytes"), cgroup.get("usage_bytes"), cgroup.get("oom_kills")
    signs = []
    if cgroup.get("path") and cgroup.get("version") and counted is not None:
        now = read_cgroup((int(cgroup["version"]), Path(cgroup["path"])))
        if now is not None and now.oom_kills is not None and now.oom_kills > counted:
            signs.append(f"its cgroup counts {now.oom_kills - counted} OOM kill(s) since its last record")
    if limit and usage is not None and usage >= NEAR_LIMIT * limit:
        signs.append(f"its cgroup stood at {usage / limit:.0%} of its {_size(limit)} limit")
    if not signs:
        return None
    held = f"{_size(record.host_end_bytes)}" if record.host_end_bytes is not None else "?"
    return f"{' and '.join(signs)}; at the end of {record.stage} (step {record.step}) the process held {held}"
