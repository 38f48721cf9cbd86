"""The checkpoint ledger read back: each save with its ``began`` and ``saved`` lines, each
load, each loop's end, and the saves that did not finish.  Standard library only.

A save is **incomplete** (:func:`incomplete`) when:

* its rank wrote ``began`` and no ``saved`` line after it: the process stopped inside the
  save (killed, crashed) and wrote no manifest;
* its ``saved`` line names an exception: the save raised, its files may be partial;
* a file it wrote is there now with another size than the one written (cut short, or
  rewritten since).  Only the file's size is looked at (``os.stat``): nothing is read.  A
  file that is gone is no alarm (verl removes old checkpoints: ``max_ckpt_to_keep``).  The
  ledger is untrusted: only a file of an absolute ``.../global_step_N/<kind>`` folder, named
  by a plain file name, is looked at; a save in any other folder is not checked this way.

A save whose rank is still writing it reads as ``incomplete`` too, and says so.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from .record import Alarm, CheckpointRecord

__all__ = ["Found", "Ledger", "Save", "incomplete", "read_ledger"]


@dataclass
class Save:
    """One save on one rank: its ``began`` line, and its ``saved`` line once written."""

    step: int | None
    rank: int
    path: str | None
    began: CheckpointRecord | None = None
    saved: CheckpointRecord | None = None
    #: ``incomplete``, when it is (:func:`incomplete`); found when the ledger is read.
    cut: Alarm | None = None
    #: Files it wrote that are gone now (removed by verl's rotation, or by hand): no alarm.
    gone: list[str] = field(default_factory=list)

    @property
    def alarms(self) -> list[Alarm]:
        return ([self.cut] if self.cut else []) + (self.saved.alarms if self.saved else [])

    @property
    def time(self) -> float:
        record = self.saved or self.began
        return record.time if record is not None else 0.0


@dataclass
class Ledger:
    saves: list[Save]
    loads: list[CheckpointRecord]
    loops: list[CheckpointRecord]

    def alarms(self) -> list[Found]:
        """Every alarm, in the order a run meets them: by step, then a load (which comes
        before its step's training), a save, the loop's end; then by rank.  Ranks' clocks
        would order two ranks' alarms of one step by chance."""
        found = [Found(s.time, s.step, s.rank, "save", a) for s in self.saves for a in s.alarms]
        found += [Found(r.time, r.step, r.rank, "load", a) for r in self.loads for a in r.alarms]
        found += [Found(r.time, r.step, r.rank, "loop", a) for r in self.loops for a in r.alarms]
        return sorted(found, key=lambda f: (-1 if f.step is None else f.step, _PHASES.index(f.what), f.rank))


_PHASES = ("load", "save", "loop")


class Found(NamedTuple):
    """One alarm, with when and where: ``what`` is ``save``, ``load`` or ``loop``."""

    time: float
    step: int | None
    rank: int
    what: str
    alarm: Alarm


def read_ledger(records: Iterable[CheckpointRecord], size_of: Callable[[str], int | None] | None = None) -> Ledger:
    """The ledger of ``records`` (one run's, in the order written); ``size_of`` gives a
    file's size now (None: gone), by default :func:`file_size`."""
    saves: list[Save] = []
    under_way: dict[tuple[int, int | None, str | None], Save] = {}
    loads, loops = [], []
    for record in sorted(records, key=lambda r: r.time):
        key = (record.rank, record.step, record.path)
        if record.kind == "began":
            save = Save(record.step, record.rank, record.path, began=record)
            under_way[key] = save
            saves.append(save)
        elif record.kind == "saved":
            # A stage without a path (emitted by hand) learns its folder from the files it wrote.
            began = under_way.pop(key, None) or under_way.pop((record.rank, record.step, None), None)
            save = began if began is not None else Save(record.step, record.rank, record.path)
            if began is None:  # its began line is lost (a damaged line): the save stands on its own
                saves.append(save)
            save.saved, save.path = record, save.path or record.path
        elif record.kind == "loaded":
            loads.append(record)
        else:
            loops.append(record)
    for save in saves:
        save.cut = incomplete(save, size_of or file_size)
    saves.sort(key=lambda s: (-1 if s.step is None else s.step, s.rank))
    loads.sort(key=lambda r: (-1 if r.step is None else r.step, r.rank))
    return Ledger(saves, loads, loops)


def incomplete(save: Save, size_of: Callable[[str], int | None]) -> Alarm | None:
    """``incomplete`` for a save that did not finish (see the module docstring), else None."""
    where = f" to {save.path}" if save.path else ""
    if save.saved is None:
        return Alarm(
            "incomplete",
            None,
            [],
            0,
            f"rank {save.rank} began saving step {save.step}{where} and left no manifest: the save did not finish "
            "(the process was killed or crashed inside it, or, on a run still going, is writing it now); do not "
            "resume from this checkpoint",
        )
    if save.saved.error is not None:
        return Alarm("incomplete", None, [], 0, f"the save raised {save.saved.error}: its files may be partial")
    cut: list[str] = []
    folder = save.path
    if folder is None or not _checkpoint_folder(folder):
        return None
    for file in save.saved.files:
        if file.get("bytes") is None:
            continue
        now = size_of(os.path.join(folder, file["name"]))
        if now is None:
            save.gone.append(file["name"])
        elif now != file["bytes"]:
            cut.append(f"{file['name']} ({now} bytes now, {file['bytes']} written)")
    if cut:
        return Alarm(
            "incomplete",
            None,
            [],
            len(cut),
            f"{len(cut)} file(s) of this save differ in size from what was written (cut short, or rewritten "
            f"since): {', '.join(cut[:5])}",
        )
    return None


_STEP_FOLDER = re.compile(r"^global_step_\d+$")


def _checkpoint_folder(path: str | None) -> bool:
    """Whether ``path`` is an absolute ``.../global_step_N/<kind>`` folder, the only kind whose
    files' sizes are looked at."""
    return (
        path is not None and os.path.isabs(path) and bool(_STEP_FOLDER.match(os.path.basename(os.path.dirname(path))))
    )


def file_size(path: str) -> int | None:
    """The size of the regular file ``path`` now, or None when there is none (only its
    metadata is looked at)."""
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None
