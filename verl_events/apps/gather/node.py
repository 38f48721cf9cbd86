"""What one node holds of a run: the part of ``verl-events gather`` that runs on each node.

:func:`read_node_folder` runs in a Ray task pinned to one node (:mod:`.command`).  It
fills ``{node}`` of the run's path with the node's name, as the run's processes
did there (:func:`verl_events.layout.node_name`: Ray's node id), follows a ``latest``
link, and reads the files to gather:

* by default the small ones: a file whose name ends in ``.json``, ``.jsonl`` or
  ``.txt`` (records, heartbeats, hang reports, crash records, ``run.json``), and the
  driver's ``trainer.log`` (:data:`~verl_events.layout.DRIVER_LOG`, which ``diagnose``
  reads), outside the step tree (``step_*``: msprobe dumps, profiler traces, a replay's inputs), up to
  ``max_bytes`` each;
* with ``everything``, every file.

A name that starts with ``.`` is a writer's temporary file (written aside, then
moved into place) and is never read; nor is a symbolic link.  What is not a regular
file (a FIFO, a socket, a device) is named as not readable, never waited on: the
node's other files still come.  What is left is
counted by why, so the command can say what ``--all`` would add.  Standard library
and :mod:`verl_events.layout` only: this module is imported on every node.
"""

from __future__ import annotations

import fnmatch
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from verl_events.layout import DRIVER_LOG, NODE_PLACEHOLDER, STEP_DIR_GLOB, node_name, open_regular

__all__ = [
    "DEFAULT_MAX_BYTES",
    "RECORD_SUFFIXES",
    "SKIPPED_LARGE",
    "SKIPPED_OTHER",
    "SKIPPED_STEPS",
    "NodeFile",
    "NodeFolder",
    "read_node_folder",
]

#: What a record, a heartbeat, a report or a crash record is called.
RECORD_SUFFIXES = (".json", ".jsonl", ".txt")
#: The largest file gathered without ``--all``.
DEFAULT_MAX_BYTES = 256 * 2**20
#: Why a file was left where it is, without ``--all``.
SKIPPED_STEPS = "the step tree (msprobe dumps, profiler traces)"
SKIPPED_OTHER = "not a record (.json, .jsonl, .txt)"
SKIPPED_LARGE = "over the size limit"


@dataclass(frozen=True, slots=True)
class NodeFile:
    """One file of a node's folder: its path under the folder (``/``-separated), its
    modification time and its bytes."""

    path: str
    mtime: float
    data: bytes


@dataclass(slots=True)
class NodeFolder:
    """What :func:`read_node_folder` found on one node.  ``folder`` is None when the node
    holds no such folder; ``sent_files`` and ``sent_bytes`` count ``files`` (which the
    command empties once written); ``skipped`` maps a reason to (files, bytes); ``large``
    names the files over the size limit, ``unreadable`` those that could not be read."""

    node: str
    host: str
    folder: str | None
    files: list[NodeFile] = field(default_factory=list)
    sent_files: int = 0
    sent_bytes: int = 0
    skipped: dict[str, tuple[int, int]] = field(default_factory=dict)
    large: list[tuple[str, int]] = field(default_factory=list)
    unreadable: list[tuple[str, str]] = field(default_factory=list)

    def skip(self, why: str, size: int) -> None:
        files, total = self.skipped.get(why, (0, 0))
        self.skipped[why] = (files + 1, total + size)


def read_node_folder(template: str, everything: bool = False, max_bytes: int = DEFAULT_MAX_BYTES) -> NodeFolder:
    """This node's folder of the run ``template`` names (``{node}`` filled in, ``~`` expanded,
    links followed), read as the module docstring says."""
    node = node_name()
    path = Path(os.path.expanduser(template.replace(NODE_PLACEHOLDER, node)))
    found = NodeFolder(node=node, host=socket.gethostname(), folder=None)
    if not path.is_dir():
        return found
    root = path.resolve()
    found.folder = str(root)
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (here / d).is_symlink())
        in_steps = here != root and fnmatch.fnmatch(here.relative_to(root).parts[0], STEP_DIR_GLOB)
        for name in sorted(names):
            file = here / name
            if name.startswith(".") or file.is_symlink():
                continue
            _read_file(found, root, file, not in_steps, everything, max_bytes)
    return found


def _read_file(found: NodeFolder, root: Path, file: Path, outside_steps: bool, everything: bool, limit: int) -> None:
    relative = file.relative_to(root).as_posix()
    try:
        stat = file.stat()
        why = None if everything else _left_because(outside_steps, file.name, stat.st_size, limit)
        if why is not None:
            found.skip(why, stat.st_size)
            if why == SKIPPED_LARGE:
                found.large.append((relative, stat.st_size))
            return
        with open_regular(file) as opened:  # a FIFO or a device is refused, never waited on
            data = opened.read()
        found.files.append(NodeFile(relative, stat.st_mtime, data))
        found.sent_files += 1
        found.sent_bytes += len(data)
    except OSError as exc:  # removed or replaced meanwhile (a live run), not readable, not a regular file
        found.unreadable.append((relative, exc.strerror or str(exc)))


def _left_because(outside_steps: bool, name: str, size: int, limit: int) -> str | None:
    """Why a file is not gathered without ``--all``, or None."""
    if not outside_steps:
        return SKIPPED_STEPS
    if not name.endswith(RECORD_SUFFIXES) and name != DRIVER_LOG:
        return SKIPPED_OTHER
    return SKIPPED_LARGE if size > limit else None
