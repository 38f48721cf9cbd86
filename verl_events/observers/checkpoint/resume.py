"""Where a load came from: the save's manifest beside the files, and whether the folder
holds a later complete save.  Standard library only.

Both read a checkpoint folder another run (another host, another person) wrote: only our
own manifest (:func:`~.record.read_manifest`: checked value by value) and verl's tracker
file, a few bytes, are read, through the one reader of regular files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from verl_events.layout import RunFileRefused, read_regular

from .record import Manifest, NotACheckpointRecord, manifest_path, read_manifest

__all__ = ["TRACKER", "later_save", "saved_manifest"]

#: verl's record of its last complete save, beside the ``global_step_N`` folders: written by
#: the driver once every rank saved (not with ``async_save``).
TRACKER = "latest_checkpointed_iteration.txt"
_STEP_FOLDER = re.compile(r"^global_step_(\d+)$")


def saved_manifest(folder: str | None, rank: int, step: int | None) -> tuple[Manifest | None, str]:
    """The rank's manifest in ``folder``, or None and why there is none to compare with."""
    if folder is None:
        return None, "the load named no folder: nothing to compare what it loaded with"
    path = manifest_path(folder, rank)
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        return None, (
            f"{folder} holds no manifest of ours for rank {rank} ({path.name}): the checkpoint was not saved with "
            "the checkpoint observer on (or by another world size), so what was loaded cannot be checked against it"
        )
    except (OSError, NotACheckpointRecord) as exc:
        return None, f"{path} cannot be read as a manifest ({exc}): what was loaded cannot be checked against it"
    if manifest.rank != rank:
        return None, f"{path} names rank {manifest.rank}, not {rank}: it is no manifest of this rank's save"
    if step is not None and manifest.step is not None and manifest.step != step:
        return None, f"{path} was written by the save of step {manifest.step}, not of step {step} (the folder's)"
    return manifest, ""


def later_save(folder: str | None, rank: int, step: int | None) -> str | None:
    """What shows a complete save later than ``step`` beside ``folder``
    (``.../global_step_N/actor``), or None.

    verl's tracker decides where it is there: it names the last save every rank finished, so
    a later folder from a save that died halfway is no later save.  Without it (verl's
    ``async_save``, another trainer), the newest ``global_step_M`` folder holding this rank's
    manifest.  Only names, and the tracker's few bytes, are read."""
    if folder is None or step is None:
        return None
    loaded = Path(folder)
    step_folder, kind, root = loaded.parent, loaded.name, loaded.parent.parent
    if not _STEP_FOLDER.match(step_folder.name):
        return None
    latest = _tracked(root / TRACKER)
    if latest is not None:
        return f"verl's {root / TRACKER} names step {latest}" if latest > step else None
    try:
        names = [entry.name for entry in os.scandir(root)]
    except OSError:
        return None
    later = sorted(
        (int(match.group(1)), name)
        for name in names
        if (match := _STEP_FOLDER.match(name)) and int(match.group(1)) > step
    )
    for _, name in reversed(later):
        if manifest_path(root / name / kind, rank).is_file():
            return f"{root / name / kind} holds a later save of ours"
    return None


def _tracked(path: Path) -> int | None:
    """The step verl's tracker names, or None when there is none (or it holds no step)."""
    try:
        text = read_regular(path, 64).decode("ascii", "replace").strip()
    except (OSError, RunFileRefused):
        return None
    return int(text) if text.isdigit() and len(text) < 19 else None
