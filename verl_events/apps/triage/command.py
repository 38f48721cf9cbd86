"""``verl-events triage RUN``: from a recorded anomaly to the op behind it.

Reads ``{RUN}/anomalies.jsonl`` (the sentinel's
:data:`~verl_events.observers.sentinel.record.ANOMALY_LOG`, one
:class:`~verl_events.observers.sentinel.record.AnomalyRecord` per anomaly
a watcher saw: step, stage, rank, metric, value, rule, baseline, detail,
run, time) and the msprobe dumps of the run, and names, for the first
anomaly (lowest step, then earliest time):

* first, when the stage was replayed (``{RUN}/replays.jsonl`` has the
  sentinel's verdict for that step, stage and rank; see
  :mod:`verl_events.apps.triage.replay`), the verdict; for a
  ``reproducible`` one the search below runs on the replay's own dump,
  ``step_{N}/{stage}.replay``: the anomalous step itself.  A reproducible
  one whose replay dump shows nothing goes on to the dumps of the later
  steps.  So does a ``transient`` one, but those can only show where the
  bad values went (:attr:`Triage.downstream`): the op found there is a
  consequence, never named as the cause;

* ``non_finite``: the first op, in execution order, with a NaN or Inf in
  any statistic (Max, Min, Mean, Norm) of any tensor it saw (the parts that
  have one are named: output, inputs, parameters, gradients), in the first
  dump after the anomaly's step that holds one; that rank's dumps are
  scanned by step, then verl's stage order (another rank's, with a note,
  when that rank has none after the step); see
  :mod:`verl_events.apps.triage.non_finite`;
* ``spike`` (and ``above``/``below``): what moved between the last healthy
  dump of a stage (a step before the anomaly) and the first dump of that
  stage after it (the anomaly's own stage is tried first); see
  :mod:`verl_events.apps.triage.spike`: a parameter that jumped, else the
  earliest op whose output moved as much as the largest move.

For the op: its module, the first user frame of its call stack, and the
parameter it read when the dump holds parameters
(:mod:`verl_events.apps.triage.finding`).  What triage relies on in
msprobe 26.2 dumps, and which frame is the user's, is in
:mod:`verl_events.apps.triage.dumps`.

Exit codes: 0 nothing recorded, 1 an anomaly (whether or not an op was
found), 2 bad input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_events.layout import LATEST_LINK, owner_of, replay_dir_name, replayed_stage, stage_dir
from verl_events.observers.msprobe import layout as msprobe_layout
from verl_events.observers.sentinel import record as anomaly_record

from ..read.record import Evidence, records_of
from .dumps import find_dumps, is_library_frame, read_session, user_frame
from .finding import Finding
from .non_finite import first_non_finite
from .replay import Replay, replay_of
from .spike import most_moved

# The formats' names, as their owners define them.
AnomalyRecord = anomaly_record.AnomalyRecord
NotAnAnomalyRecord = anomaly_record.NotAnAnomalyRecord
anomaly_log_path = anomaly_record.anomaly_log_path
SessionPlace = msprobe_layout.SessionPlace

__all__ = [
    "Anomaly",
    "Triage",
    "TriageInputError",
    "is_library_frame",  # re-exported from .dumps, where the user frame is defined
    "read_anomalies",
    "triage",
    "user_frame",
]


class TriageInputError(ValueError):
    """RUN cannot be triaged (exit 2); the message says why."""


# -- the anomalies -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One line of anomalies.jsonl, read back (``record``), and its line number."""

    record: AnomalyRecord
    line: int

    @property
    def step(self) -> int | None:
        return self.record.step

    @property
    def rule(self) -> str:
        return self.record.rule

    def as_json(self) -> dict[str, Any]:
        """The record as it was written, with its line number."""
        return dict(self.record.to_data(), line=self.line)

    def describe(self) -> str:
        r = self.record.to_data()  # value and baseline as written: "nan", not a float
        text = f"step {r['step']} {r['stage']} rank {r['rank']}: {r['metric']} = {r['value']} ({r['rule']}"
        text += f", baseline {r['baseline']})" if r["baseline"] is not None else ")"
        return text + (f": {r['detail']}" if r["detail"] else "")


def read_anomalies(evidence: Evidence) -> list[Anomaly]:
    """The anomalies of the run, in file order; a line that is not JSON or not an anomaly
    record, or a record of another run, is skipped with a sentence in ``evidence.warnings``.
    No file is no anomaly; a file that cannot be read raises TriageInputError."""
    path = anomaly_log_path(evidence.run)
    return [Anomaly(record, number) for number, record in records_of(evidence, path, AnomalyRecord, TriageInputError)]


# -- the whole triage ------------------------------------------------------------------------


@dataclass(slots=True)
class Triage:
    """What triage found for the first anomaly of a run: the verdict of its
    replay, if the stage was replayed, the op (or why none is named), the
    dump it is in and, for a spike, the healthy dump it was compared with."""

    run: Path
    anomalies: list[Anomaly]
    finding: Finding | None = None
    dump: SessionPlace | None = None
    healthy_dump: SessionPlace | None = None
    replay: Replay | None = None
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def anomaly(self) -> Anomaly | None:
        return self.anomalies[0] if self.anomalies else None

    def as_json(self) -> dict[str, Any]:
        anomaly = self.anomaly
        return {
            "run": str(self.run),
            "anomalies": len(self.anomalies),
            "anomaly": None if anomaly is None else anomaly.as_json(),
            "found": self.finding is not None and not self.downstream,
            "dump": None if self.dump is None else str(self.dump.path),
            "healthy_dump": None if self.healthy_dump is None else str(self.healthy_dump.path),
            "replay": None if self.replay is None else self.replay.as_json(self.dump if self.in_replay else None),
            "op": None if self.finding is None or self.downstream else self.finding.as_json(),
            "later_op": self.finding.as_json() if self.finding is not None and self.downstream else None,
            "reason": self.reason or None,
            "notes": self.notes,
            "warnings": self.warnings,
        }

    @property
    def in_replay(self) -> bool:
        """Whether ``dump`` is the replay's: the anomalous step itself."""
        return self.dump is not None and replayed_stage(self.dump.stage) is not None

    @property
    def downstream(self) -> bool:
        """Whether the dumps searched can show only consequences: the replay ran clean
        (``transient``), so the fault did not reproduce and no dump holds the op that
        made it; a later step's dump shows where the bad values went, not where they
        came from.  An op found there is ``later_op`` in JSON, not ``op``."""
        return self.replay is not None and self.replay.verdict == "transient" and not self.in_replay


def triage(run: Path) -> Triage:
    """Triage the first anomaly of ``run`` (its save_path).  Raises
    TriageInputError when ``run`` is not a directory or its anomalies.jsonl
    cannot be read; unreadable lines become ``warnings``."""
    evidence = Evidence.of_folder(run, TriageInputError)
    _refuse_a_folder_of_runs(run)
    result = Triage(run, [], warnings=evidence.warnings)
    anomalies = read_anomalies(evidence)
    if not anomalies:
        result.reason = f"no anomalies recorded in {anomaly_log_path(run)}"
        return result
    # The earliest is the cause; those after it are usually its consequences.
    result.anomalies = sorted(anomalies, key=lambda a: (a.step is None, a.step or 0, _time(a)))
    runs = list(dict.fromkeys(str(a.record.run) for a in anomalies if a.record.run is not None))
    if len(runs) > 1:  # a folder without run.json: which run's dumps these are cannot be told
        result.warnings.append(f"{anomaly_log_path(run)} names runs {', '.join(runs)}, and the folder no run")
    anomaly = result.anomalies[0]
    if anomaly.step is None:
        result.reason = "the anomaly has no step, so triage cannot tell which dumps follow it"
        return result
    result.replay = replay_of(evidence, anomaly.record, result.notes)
    if result.replay is not None and result.replay.verdict == "reproducible" and _in_replay(result, anomaly, run):
        return result
    dumps = [d for d in find_dumps(run) if d.step > anomaly.step]
    if not dumps:
        result.reason = (
            f"no msprobe dump after step {anomaly.step}: msprobe was not armed (no msprobe observer with "
            f"trigger: anomaly), or the run stopped before step {anomaly.step + 1}"
        )
        return result
    rank = anomaly.record.rank
    if not any(d.rank == rank for d in dumps):
        result.notes.append(
            f"rank {rank} has no dump after step {anomaly.step}; the dumps of rank(s) "
            f"{', '.join(map(str, sorted({d.rank for d in dumps})))} are used instead"
        )
    else:
        dumps = [d for d in dumps if d.rank == rank]
    if anomaly.rule == "non_finite":
        _non_finite(result, anomaly.step, dumps)
    else:
        _moved(result, anomaly, find_dumps(run), dumps)
    return result


def _in_replay(result: Triage, anomaly: Anomaly, run: Path) -> bool:
    """Search the replay's dump of a reproducible anomaly; whether it named the op."""
    assert result.replay is not None and anomaly.step is not None
    dumps = result.replay.dumps
    if not dumps:
        stage = anomaly.record.stage
        where = stage_dir(run, anomaly.step, replay_dir_name(stage))
        result.notes.append(
            f"the replay of step {anomaly.step} has no msprobe dump in {where} "
            f"(msprobe was not armed for {stage}, or had no capture left)"
        )
        return False
    if all(d.rank != anomaly.record.rank for d in dumps):
        result.notes.append(
            f"rank {anomaly.record.rank} has no replay dump of step {anomaly.step}; the replay dumps of rank(s) "
            f"{', '.join(map(str, sorted({d.rank for d in dumps})))} are used instead"
        )
    if anomaly.rule == "non_finite":
        _non_finite(result, anomaly.step, dumps)
    else:
        _moved(result, anomaly, find_dumps(run), dumps)
    if result.finding is not None:
        return True
    result.notes.append(f"the replay's dump names no op ({result.reason}); the dumps after step {anomaly.step} follow")
    result.reason, result.dump, result.healthy_dump = "", None, None
    return False


def _refuse_a_folder_of_runs(run: Path) -> None:
    """TriageInputError for the folder that holds a ``{run}`` save_path's runs:
    it has no run of its own, and "no anomalies" would read as a healthy run."""
    latest = run / LATEST_LINK
    if latest.exists() and owner_of(run) is None and not anomaly_log_path(run).exists():
        raise TriageInputError(
            f"{run} holds runs, one folder each (save_path: .../{{run}}), not a run; "
            f"triage one of them, e.g. the newest: verl-events triage {latest}"
        )


def _time(anomaly: Anomaly) -> float:
    value = anomaly.record.time  # as the line holds it: from_json does not check its type
    return float(value) if isinstance(value, (int, float)) else math.inf


def _non_finite(result: Triage, step: int, dumps: list[SessionPlace]) -> None:
    for dump in dumps:
        session = read_session(dump, result.notes)
        if session is not None and (finding := first_non_finite(session)) is not None:
            result.finding, result.dump = finding, dump
            return
    if all(d.step == step for d in dumps):  # the replay's
        result.reason = f"the {len(dumps)} replay dump(s) of step {step} hold no NaN or Inf"
        return
    steps = sorted({d.step for d in dumps})
    result.reason = (
        f"none of the {len(dumps)} dump(s) after step {step} (steps {', '.join(map(str, steps))}) holds a NaN or Inf: "
        "the non-finite value did not recur in the dumped stages"
    )


def _moved(result: Triage, anomaly: Anomaly, every: list[SessionPlace], after: list[SessionPlace]) -> None:
    step, stage = anomaly.step or 0, anomaly.record.stage
    # The anomaly's own stage first (sort is stable); a replay is compared with its stage's healthy dumps.
    for armed in sorted(after, key=lambda d: _stage_of(d) != stage):
        earlier = [d for d in every if d.stage == _stage_of(armed) and d.rank == armed.rank and d.step < step]
        if not earlier:
            continue
        healthy = max(earlier, key=lambda d: (d.step, d.call == armed.call))
        after_session, healthy_session = read_session(armed, result.notes), read_session(healthy, result.notes)
        if after_session is None or healthy_session is None:
            continue
        result.dump, result.healthy_dump = armed, healthy
        result.finding = most_moved(after_session, healthy_session)
        if result.finding is None:
            result.reason = f"{armed.path} and {healthy.path} share no entry to compare"
        return
    stages = ", ".join(sorted({_stage_of(d) for d in after}))
    result.reason = (
        f"no healthy dump to compare with: no dump of {stages} before step {step} "
        f"(rank {', '.join(map(str, sorted({d.rank for d in after})))}); a {anomaly.rule} is triaged against the last "
        "dump of the same stage before the anomaly, so select an earlier step for msprobe too (e.g. steps: [1])"
    )


def _stage_of(dump: SessionPlace) -> str:
    """The stage a dump is of: a replay's (``{stage}.replay``) is its stage's."""
    return replayed_stage(dump.stage) or dump.stage
