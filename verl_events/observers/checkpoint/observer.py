"""The checkpoint observer: what each rank saved, whether a resume restored it, and whether
the resumed run really trained.

Config::

    - name: checkpoint

No options.  It watches verl's ``save_checkpoint`` and ``load_checkpoint`` stages on every
trainer rank (the verl bridge makes them stages, with the checkpoint's folder in
``meta["path"]``), the update stages between them, and, on the driver, the trainer loop's
end (:mod:`verl_events.bus.progress`):

* **a save**: a ``began`` line first (a save cut short leaves it alone), then, once verl
  wrote the rank's files, its manifest: every tensor handed to ``torch.save`` (model,
  optimizer, extra state: :mod:`.taps`) with shape, dtype, bytes, fingerprint and NaN
  count, and each file's size.  The manifest is written beside the files
  (``verl_events.rank{R}.json``) and summed up in the ledger's ``saved`` line, with the
  alarms ``unchanged`` and ``nonfinite`` (:mod:`.judge`);
* **a load**: what the rank holds once the model and the optimizer were loaded, and what
  each ``torch.load`` read, compared with the manifest beside the files (``not_restored``),
  and the folder's step against the latest complete save in the same checkpoint root
  (``wrong_checkpoint``, also when the folder holds no manifest of this rank's save:
  :mod:`.resume`);
* **the loop's end**, on the driver: ``no_progress`` when it trained none, or fewer steps
  than asked.

Each alarm of a save or a load is also sent as an ``anomaly`` (metric
``checkpoint/<kind>``); the loop's end comes after training, and is in the ledger only.
An update counts for the folder of its role (``actor_update`` for ``actor/``,
``critic_update`` for ``critic/``).  ``incomplete``
is found when the ledger is read (``verl-events checkpoints``): a ``began`` with no
``saved`` after it.  Nothing is read back from disk: a save describes what verl hands to
``torch.save``, a load what verl's own ``torch.load`` returned.  Passive; a stage that is
neither costs one comparison.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from verl_events import (
    DRIVER_RANK,
    AnomalyEvent,
    InstallContext,
    LoopEnded,
    Observer,
    StageEnd,
    StageEvent,
    Writes,
    prepare_output_dir,
    send_anomaly,
    unwatch_progress,
    watch_progress,
)
from verl_events.layout import run_id

from .._lines import append_line
from .judge import judge_load, judge_loop, judge_save, tensor_count
from .record import (
    Alarm,
    CheckpointRecord,
    Manifest,
    TensorEntry,
    checkpoint_files,
    checkpoint_log_path,
    manifest_path,
)
from .resume import later_save, saved_manifest

__all__ = ["LOAD", "SAVE", "UPDATE_STAGES", "CheckpointObserver"]

logger = logging.getLogger("verl_events.checkpoint")

SAVE = "save_checkpoint"
LOAD = "load_checkpoint"
#: The stages whose end without error means an optimizer step ran, and the checkpoint folder
#: (verl's ``global_step_N/actor``, ``/critic``) whose state that step changed.
UPDATE_STAGES = {"actor_update": "actor", "critic_update": "critic"}


class CheckpointObserver(Observer):
    """Manifests at every save, a comparison at every load, the loop's end on the driver."""

    passive = True
    sends_anomalies = True
    sees_driver = True  # the trainer loop's end is the driver's
    writes = Writes("checkpoint ledger(s)", checkpoint_files, "checkpoints", "verl_events.apps.checkpoints")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root = Path()
        self._strict = False
        self._run_id: Any = run_id
        self._taps: Any = None
        self._open: dict[int, Any] = {}  # (tap, the tap it hides) of each save or load under way, by seq
        # By folder kind (actor, critic): the optimizer updates in this process (its update stages
        # that ended without error), that count at its last save, and what that save held.
        self._updates: dict[str, int] = {}
        self._updates_at_save: dict[str, int] = {}
        self._previous: dict[str, tuple[int | None, dict[str, dict[str, TensorEntry]]]] = {}

    def setup(self, context: InstallContext) -> None:
        from . import taps  # torch: only where the observer runs

        self._run_id, self._strict, self._root = context.run_id, context.strict, Path(context.save_path)
        prepare_output_dir(self._root)
        taps.add_user()
        self._taps = taps
        watch_progress(self)

    def close(self) -> None:
        unwatch_progress(self)
        with self._lock:  # a save or load still under way (closed from another thread): its tap sees no more
            for tap, _ in self._open.values():
                tap.close()
            self._open.clear()
        if self._taps is not None:
            self._taps.remove_user()
            self._taps = None

    def describe(self) -> str:
        return "a manifest of every checkpoint save, each resume compared with it, the trainer loop's progress"

    # -- stages ---------------------------------------------------------------------------

    def on_stage_begin(self, event: StageEvent) -> None:
        if event.stage not in (SAVE, LOAD) or self._taps is None:
            return
        tap = self._taps.Tap()
        outer = self._taps.open_tap(tap)
        with self._lock:
            self._open[event.seq] = (tap, outer)
        if event.stage == SAVE:
            self._append(self._record(event, "began", _folder(event, tap)))

    def on_stage_end(self, event: StageEnd) -> None:
        if event.stage in UPDATE_STAGES:
            if event.error is None:
                kind = UPDATE_STAGES[event.stage]
                with self._lock:
                    self._updates[kind] = self._updates.get(kind, 0) + 1
            return
        if event.stage not in (SAVE, LOAD):
            return
        with self._lock:
            tap, outer = self._open.pop(event.seq, (None, None))
        if tap is None:
            return
        self._taps.close_tap(outer)
        if event.stage == SAVE:
            self._saved(event, tap)
        else:
            self._loaded(event, tap)

    # -- a save ---------------------------------------------------------------------------

    def _saved(self, event: StageEnd, tap: Any) -> None:
        folder = _folder(event, tap)
        parts = _by_part(tap.saved)  # a file whose tensors could not be described: left out
        files = [{"name": f.name, "part": f.part, "bytes": f.bytes} for f in tap.saved]
        kind = Path(folder).name if folder else ""
        with self._lock:
            # A folder of another kind (a custom trainer's) is changed by any update.
            done = self._updates.get(kind, sum(self._updates.values()))
            counted: int | None = done - self._updates_at_save.get(kind, 0)
            self._updates_at_save[kind] = done
            previous_step, previous = self._previous.get(kind, (None, None))
            if event.error is None:
                self._previous[kind] = (event.step, parts)
        # A selection without the update stages never sees one: unknown, and nothing is judged unchanged.
        updates = counted if self._sees_updates() else None
        alarms = judge_save(parts, previous, updates, previous_step)
        if folder and event.error is None:  # also when no torch.save was seen: a load then compares nothing
            self._write_manifest(folder, Manifest(self._run_id(), event.step, event.rank, files, parts))
        error = None if event.error is None else _one_line(f"{type(event.error).__name__}: {event.error}")
        record = self._record(
            event,
            "saved",
            folder,
            files=files,
            parts={p: _summary(t) for p, t in parts.items()},
            updates=updates,
            error=error,
            alarms=alarms,
            seconds=round(tap.seconds, 6),
        )
        self._append(record)
        self._log_failures(tap)
        self._send(record, SAVE)

    def _sees_updates(self) -> bool:
        stages = self.selection.stages
        return stages is None or any(stage in stages for stage in UPDATE_STAGES)

    def _write_manifest(self, folder: str, manifest: Manifest) -> None:
        """The manifest beside the files, whole or not at all (written aside, then renamed)."""
        path = manifest_path(folder, manifest.rank)
        aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            aside.write_text(manifest.to_json())
            os.replace(aside, path)
        except OSError as exc:
            if self._strict:
                raise
            logger.warning("checkpoint: rank %d: the manifest %s cannot be written (%s)", manifest.rank, path, exc)

    # -- a load ---------------------------------------------------------------------------

    def _loaded(self, event: StageEnd, tap: Any) -> None:
        if event.error is not None:
            return  # the load raised: the run's failure, which the timing log and the watchdog show
        folder = _folder(event, tap)
        alarms, compared, saved_step = [], None, None
        manifest, missing = saved_manifest(folder, event.rank, event.step)
        if manifest is None:
            alarms.append(Alarm("wrong_checkpoint", None, [], 0, missing))
        else:
            saved_step = manifest.step
            held, read = tap.applied, _by_part(tap.loaded)
            found, compared = judge_load(manifest.tensors, held, read, saved_step, unknown=tap.undescribed)
            alarms += found
        later = later_save(folder, event.rank, event.step)
        if later is not None:
            alarms.append(
                Alarm(
                    "wrong_checkpoint",
                    None,
                    [],
                    0,
                    f"loaded step {event.step} from {folder}, but {later}: the run resumed from an older "
                    "checkpoint than its folder's latest",
                )
            )
        record = self._record(
            event,
            "loaded",
            folder,
            files=[{"name": f.name, "part": f.part, "bytes": None} for f in tap.loaded],
            compared=compared,
            alarms=alarms,
            seconds=round(tap.seconds, 6),
        )
        self._append(record)
        self._log_failures(tap)
        self._send(record, LOAD)

    # -- the loop's end (verl_events.bus.progress) ----------------------------------------

    def loop_ended(self, ended: LoopEnded) -> None:
        record = CheckpointRecord(
            run=self._run_id(),
            kind="loop_ended",
            step=ended.last_step,
            rank=DRIVER_RANK,
            time=time.time(),
            alarms=judge_loop(ended),
            resumed_from=ended.resumed_from,
            total_steps=ended.total_steps,
            last_step=ended.last_step,
        )
        self._append(record)  # after training: no capture left to arm, so no anomaly either

    # -- writing --------------------------------------------------------------------------

    def _record(self, event: StageEvent, kind: str, path: str | None, **fields: Any) -> CheckpointRecord:
        return CheckpointRecord(
            run=self._run_id(),
            kind=kind,
            step=event.step,
            rank=event.rank,
            time=time.time(),
            path=None if path is None else os.path.abspath(path),  # read elsewhere, from another folder
            **fields,
        )

    def _append(self, record: CheckpointRecord) -> None:
        append_line(checkpoint_log_path(self._root), record.to_json())

    def _log_failures(self, tap: Any) -> None:
        """Descriptions that failed: the observer's own trouble, logged, never an alarm about
        the checkpoint (its record counts only what was described)."""
        for failure in tap.failures:
            if self._strict:
                raise RuntimeError(f"checkpoint: {failure}")
            logger.warning("checkpoint: %s", failure)

    def _send(self, record: CheckpointRecord, stage: str) -> None:
        for alarm in record.alarms:
            found = AnomalyEvent(
                step=record.step,
                stage=stage,
                rank=record.rank,
                metric=f"checkpoint/{alarm.kind}",
                value=float(alarm.count),
                rule=alarm.kind,
                detail=f"checkpoint {record.kind} at step {record.step}: {alarm.detail}",
            )
            logger.warning("checkpoint: rank %d: %s", record.rank, found.detail)
            send_anomaly(found, sender="checkpoint", strict=self._strict)


def _folder(event: StageEvent, tap: Any) -> str | None:
    """The checkpoint's folder: the stage's ``path``, else that of the first file written."""
    path = event.meta.get("path")
    if isinstance(path, str):
        return path
    return next((seen.folder for seen in tap.saved), None)


def _one_line(text: str, most: int = 200) -> str:
    """An exception's first line, at most ``most`` characters (the crash records keep it whole)."""
    line = text.strip().split("\n")[0]
    return line if len(line) <= most else line[: most - 1] + "…"


def _summary(tensors: dict[str, TensorEntry]) -> dict[str, int]:
    """A part's count of tensors (its other values aside) and bytes."""
    return {"tensors": tensor_count(tensors), "bytes": sum(entry[2] for entry in tensors.values())}


def _by_part(files: list[Any]) -> dict[str, dict[str, TensorEntry]]:
    parts: dict[str, dict[str, TensorEntry]] = {}
    for seen in files:
        if seen.tensors is not None:
            parts.setdefault(seen.part, {}).update(seen.tensors)
    return parts
