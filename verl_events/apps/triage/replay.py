"""What triage reads of a replay: the sentinel's verdict and the replay's own dump.

When the sentinel raised an anomaly at the end of a replayable stage, the
stage ran again in place with the same inputs and weights (see
:mod:`verl_events.capture.replay`), the armed capture observers dumped that run to
``{RUN}/step_{N}/{stage}.replay/`` (:func:`verl_events.layout.replay_dir_name`)
and the sentinel wrote its verdict to ``{RUN}/replays.jsonl``
(:data:`~verl_events.observers.sentinel.record.REPLAY_LOG`, one
:class:`~verl_events.observers.sentinel.record.ReplayRecord` per rank that
raised the anomaly):

* ``reproducible``: the replay showed the anomaly again, so the inputs or
  the weights carry it, and the replay's dump *is* the anomalous step:
  triage searches it before any dump of a later step;
* ``transient``: the same inputs and weights did not show it again (suspect
  a nondeterministic kernel or the device); the replay's dump is a healthy
  run of that step, so triage says where the stage's tensor inputs were kept
  (``inputs_rank{R}.pt``) and searches the later steps' dumps as without a
  replay; what it finds there is where the bad values travelled, not where
  they came from (:attr:`~.command.Triage.downstream`).

This module finds the verdict for an anomaly (:func:`replay_of`) and says
what it means (:data:`MEANING`); :mod:`.command` does the search.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events.layout import replayed_stage
from verl_events.observers.msprobe import layout as msprobe_layout
from verl_events.observers.sentinel import record as anomaly_record

from ..read.record import Evidence, records_of
from .dumps import find_dumps

AnomalyRecord = anomaly_record.AnomalyRecord
ReplayRecord = anomaly_record.ReplayRecord
replay_log_path = anomaly_record.replay_log_path
SessionPlace = msprobe_layout.SessionPlace

__all__ = ["MEANING", "Replay", "replay_dumps", "replay_of"]

#: Each verdict in words: what it says about the fault.
MEANING = {
    "reproducible": "the inputs or the weights carry it",
    "transient": "not reproduced with the same inputs and weights: suspect a nondeterministic kernel or the device",
}


@dataclass(frozen=True, slots=True)
class Replay:
    """The verdict on an anomaly's replay (``record``, line ``line`` of
    replays.jsonl), the replay's msprobe sessions (``dumps``: the anomaly's
    rank's, else every rank's) and the kept inputs file (``inputs``, under
    RUN, or None when none was kept)."""

    record: ReplayRecord
    line: int
    dumps: list[SessionPlace]
    inputs: Path | None

    @property
    def verdict(self) -> str:
        return self.record.verdict

    def describe(self) -> str:
        """The verdict in a sentence, with the values that showed again."""
        if self.verdict == "transient":
            return (
                "transient: not reproduced with the same inputs and weights; "
                "suspect a nondeterministic kernel or the device"
            )
        again = ", ".join(f"{metric} {value:g}" for metric, value in self.record.again.items()) or "shown"
        return f"reproducible: {again} again with the same inputs and weights, so the inputs or the weights carry it"

    def as_json(self, used: SessionPlace | None) -> dict[str, Any]:
        """The record as written, its line, the verdict's meaning, the replay
        dump (``used`` when triage read it, else the first found) and the
        inputs file as paths under RUN."""
        data: dict[str, Any] = json.loads(self.record.to_json())
        dump = used if used is not None else (self.dumps[0] if self.dumps else None)
        data.update(
            line=self.line,
            meaning=MEANING[self.verdict],
            dump=None if dump is None else str(dump.path),
            inputs=None if self.inputs is None else str(self.inputs),
        )
        return data


def replay_of(evidence: Evidence, anomaly: AnomalyRecord, notes: list[str]) -> Replay | None:
    """The replay of ``anomaly``'s stage at its step on its rank, from
    ``{run}/replays.jsonl``; None when there was none (no file, or no line
    for that step, stage and rank).  A log that cannot be read, a line that is
    not a replay record and a record of another run are skipped with a sentence
    in ``evidence.warnings``; a named inputs file that is not there gets a
    sentence in ``notes``."""
    run, path = evidence.run, replay_log_path(evidence.run)
    for number, record in records_of(evidence, path, ReplayRecord):
        if (record.step, record.stage, record.rank) == (anomaly.step, anomaly.stage, anomaly.rank):
            inputs = None if record.inputs is None else run / record.inputs
            if inputs is not None and not inputs.is_file():
                notes.append(f"{path}:{number} names the replay's inputs {inputs}, which is not there")
            return Replay(record, number, replay_dumps(run, anomaly), inputs)
    return None


def replay_dumps(run: Path, anomaly: AnomalyRecord) -> list[SessionPlace]:
    """The msprobe sessions of the replay of ``anomaly``'s stage at its step:
    its rank's, or every rank's when its rank has none."""
    dumps = [d for d in find_dumps(run) if d.step == anomaly.step and replayed_stage(d.stage) == anomaly.stage]
    own = [d for d in dumps if d.rank == anomaly.rank]
    return own or dumps
