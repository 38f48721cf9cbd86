"""A run's identity, shared by all of its processes, and the save_path it owns.

A run is every process of one training job: Ray workers started at any time,
torchrun's ranks, the demo's spawned ranks.  They agree on :func:`run_id`:

1. Ray's session name and job id, in a process connected to Ray (every
   worker of a job, on every node);
2. ``$VERL_EVENTS_RUN_ID``, set by a launcher that names its runs, or
   inherited from the process that started this one;
3. torchrun's ``$TORCHELASTIC_RUN_ID`` (its ``--rdzv-id``; when that is the
   default ``none``, the local ranks' common parent, the elastic agent);
4. ranks started together by one parent (``torch.multiprocessing.spawn`` or
   a launcher of your own; ``$MASTER_PORT`` is set): that parent and the
   rendezvous address;
5. otherwise a new id, put into ``$VERL_EVENTS_RUN_ID`` so that the
   processes this one starts (and a Ray cluster it starts) inherit it.

The node a process runs on (:func:`node_name`, ``{node}`` in save_path) is
Ray's node id in a process connected to Ray, else ``$VERL_EVENTS_NODE``
(inherited from a Ray worker that started this process), else the host name.

An observer whose files must never mix with another run's checks
:func:`refuse_other_runs` at install and calls :func:`claim_save_path` before
its first write: the first process of the run that writes leaves
``{save_path}/run.json`` naming the run, and a process of another run is
refused while the claim or the files of the first one are there.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from verl_events.events.run_id import RUN_ID_ENV, run_id, safe_in_a_file_name

from .files import read_regular

NODE_ENV = "VERL_EVENTS_NODE"
RUN_FILE = "run.json"
#: The most read of run.json: it names a run in a few dozen bytes.
RUN_FILE_READ_LIMIT = 2**16


def node_name() -> str:
    """The node this process runs on, a folder name that every process of the node agrees on
    and no other node's has: Ray's node id in a process connected to Ray (two nodes of one
    machine differ), else ``$VERL_EVENTS_NODE``, else the host name.

    Ray's id goes into ``$VERL_EVENTS_NODE``, so that a process a Ray worker starts (which
    is not connected to Ray) names the same node.  ``verl-events gather`` resolves
    ``{node}`` with it in a task on each node.
    """
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        node = str(ray.get_runtime_context().get_node_id())
        os.environ[NODE_ENV] = node
        return node
    return os.environ.get(NODE_ENV) or safe_in_a_file_name(socket.gethostname())


class SavePathTaken(FileExistsError):
    """``save_path`` holds files of another run; the message names both runs."""


def owner_of(save_path: Path) -> str | None:
    """The run named by ``{save_path}/run.json``; None when there is none or it is unreadable."""
    try:
        owner = json.loads(read_regular(save_path / RUN_FILE, RUN_FILE_READ_LIMIT)).get("run_id")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return owner if isinstance(owner, str) else None


def refuse_other_runs(save_path: Path, existing: list[Path], what: str) -> None:
    """Raise SavePathTaken when ``existing`` (files already under ``save_path``,
    e.g. dumps) were not written by this run."""
    if not existing:
        return
    owner, mine = owner_of(save_path), run_id()
    if owner == mine:
        return  # a process joining this run: its other processes wrote them
    by = f"run {owner!r}" if owner else f"a run that left no {RUN_FILE}"
    raise SavePathTaken(
        f"save_path: {str(save_path)!r} already holds {len(existing)} {what} from another run ({by}; "
        f"this is run {mine!r}), e.g. {existing[0]}; remove them, choose another save_path, or end it in "
        "{run} (save_path: outputs/profile/{run}) to give every run its own folder, so that two runs never mix. "
        "Processes of one run share its id: "
        f"Ray's session and job id, ${RUN_ID_ENV}, or torchrun's --rdzv-id"
    )


def claim_save_path(save_path: Path, others_files: list[Path]) -> bool:
    """Make ``{save_path}/run.json`` name this run, or raise SavePathTaken;
    True when this call wrote it (False: this run had claimed it already).

    The first run to claim wins; its files and its claim keep every other
    run out.  ``others_files`` are the files already there that a claiming
    run would write (dumps, timing logs).  Another run's claim is replaced
    only when it is stale: made before this process started, and none of
    those files are there (a run that stopped before writing anything).  A
    claim made since this process started is a run started beside this one,
    and it wins.  The file appears complete or not at all (written aside,
    then hard-linked into place), so processes of one run may claim at once.
    The folder is created if it is missing.
    """
    mine = run_id()
    if owner_of(save_path) == mine:
        return False
    save_path.mkdir(parents=True, exist_ok=True)
    fd, aside = tempfile.mkstemp(dir=save_path, prefix=".run-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"run_id": mine}, handle)
        try:
            os.link(aside, save_path / RUN_FILE)
        except FileExistsError:
            owner = owner_of(save_path)
            if owner == mine:
                return False
            if others_files or _claimed_since_this_process_started(save_path):
                raise SavePathTaken(
                    f"save_path: {str(save_path)!r} is taken by run {owner!r} ({save_path / RUN_FILE}), "
                    f"which started beside or before this one; this is run {mine!r}. Two runs never share "
                    "a save_path: give each its own, or remove the other run's files and run.json"
                ) from None
            os.replace(aside, save_path / RUN_FILE)
            aside = ""
            return True
    finally:
        if aside:
            os.unlink(aside)
    return True


_PROCESS_STARTED = time.time()


def _claimed_since_this_process_started(save_path: Path) -> bool:
    try:
        return (save_path / RUN_FILE).stat().st_mtime >= _PROCESS_STARTED
    except OSError:
        return False
