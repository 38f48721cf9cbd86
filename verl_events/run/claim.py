"""One installation's hold on its save_path: refuse other runs' files, claim it once.

Every observer says what it writes under a save_path
(:meth:`~verl_events.Observer.outputs`).  Install refuses a save_path where
another run left any of those files (:func:`refuse_other_runs_files`), for all
observers at once, before any is set up.  The claim itself (``run.json``,
:func:`~verl_events.run.identity.claim_save_path`) waits for the first stage a writing
observer receives: a process that runs no stage, like verl's driver, must not
claim the save_path.  :class:`SavePathClaim` makes it, once per installation.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from verl_events.events.errors import ConfigError
from verl_events.events.observer import Observer

from .identity import SavePathTaken, claim_save_path, refuse_other_runs

logger = logging.getLogger("verl_events")


def writes_outputs(observer: Observer) -> bool:
    """Whether ``observer`` writes under save_path: its class declares ``writes``, or overrides ``outputs``."""
    return type(observer).writes is not None or type(observer).outputs is not Observer.outputs


def refuse_other_runs_files(save_path: Path, observers: Iterable[tuple[Observer, str]]) -> None:
    """ConfigError, naming the observer (``where``), when ``save_path`` holds
    files of another run that one of ``observers`` would write."""
    for observer, where in observers:
        try:
            refuse_other_runs(save_path, observer.outputs(save_path), observer.output_noun)
        except SavePathTaken as exc:
            raise ConfigError(f"{where}: {exc}") from None


class SavePathClaim:
    """The claim an installation makes on its save_path for its writers.

    :meth:`make` checks again that no other run's files are there (a run
    started beside this one may have written since install), then claims,
    and points ``latest`` (if any) at the save_path.  The dispatcher calls
    it once, under its own lock, and switches the writers off if it raises.
    """

    def __init__(self, save_path: Path, writers: Sequence[Observer], latest: Path | None = None) -> None:
        self.save_path = save_path
        self.latest = latest  # a link to point at save_path once claimed (save_path: .../{run})
        self.writers = tuple(writers)
        self.writer_names = frozenset(o.name for o in self.writers)

    def make(self) -> None:
        """Claim save_path for this run; SavePathTaken when another run holds
        it, OSError when it cannot be written."""
        files: list[Path] = []
        for observer in self.writers:
            found = observer.outputs(self.save_path)
            refuse_other_runs(self.save_path, found, observer.output_noun)
            files += found
        wrote = claim_save_path(self.save_path, files)
        # Only the process that wrote the claim moves latest: a late worker
        # of an older run must not point it back at that run.
        if wrote and self.latest is not None:
            point_at(self.latest, self.save_path)


def point_at(link: Path, folder: Path) -> None:
    """Make ``link`` a relative symbolic link to ``folder`` (its sibling),
    replacing an older link in one step: a reader sees the old run or the
    new.  A link that cannot be made (``latest`` is a real folder, a file
    system without links) is logged, never raised: the run goes on."""
    aside = link.with_name(f".{link.name}.{uuid.uuid4().hex}")
    try:
        os.symlink(folder.name, aside)
        os.replace(aside, link)
    except OSError as exc:
        aside.unlink(missing_ok=True)
        logger.warning("%s cannot point at this run's folder %s: %s", link, folder, exc.strerror or exc)
