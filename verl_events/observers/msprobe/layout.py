"""msprobe's files on disk: where a dump session's files are, how an open or
cut-off session is marked, and how they are read back.

This module is the one owner of that format.  The msprobe observer writes by
it; the tools that read dumps (``compare``, ``triage``, ``report``, ``check``)
import it.  Standard library only: importing it never imports msprobe or torch.

Our run layout (:mod:`verl_events.layout`) ends at a stage directory,
``{save_path}/step_{N}/{stage}``.  The observer hands that directory to
msprobe as its ``dump_path``, and msprobe builds the rest itself (msprobe
26.2, ``BaseService.create_dirs``)::

    {dump_path}/step{k}/rank{R}/dump.json        one session; k is msprobe's step counter
                               /stack.json       (the observer sets it to the stage's call
                               /construct.json   within the global step, normally 0) and R
                               /session.incomplete  the rank the observer passes
                               /dump_tensor_data/   the tensors, with task "tensor": one file per
                                                    entry's "data_name"
    {dump_path}/step{k}/proc{pid}/...            msprobe's name when it has no rank (dumps
                                                 not written by our observer)

msprobe writes ``stack.json`` and ``construct.json`` only with its
``extra_info`` on (the default), so a reader checks that they exist.
``session.incomplete`` is ours: it is there while a session is open, and
after it when the stage raised; readers say "incomplete" for such a session.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events import Record
from verl_events.layout import read_regular, stage_dirs, step_of

__all__ = [
    "CONSTRUCT_FILE",
    "DUMP_FILE",
    "INCOMPLETE_MARKER",
    "MODULE_ENTRY",
    "STACK_FILE",
    "TENSOR_DIR",
    "NotADump",
    "SessionPlace",
    "construct_file",
    "dump_file",
    "holds_sessions",
    "incomplete_reason",
    "incomplete_sessions",
    "mark_complete",
    "mark_incomplete",
    "proc_dirs",
    "rank_dir",
    "rank_dirs",
    "read_construct",
    "read_dump",
    "read_stacks",
    "session_dir",
    "session_dirs",
    "session_places",
    "stack_file",
    "step_dir",
    "tensor_file",
]

DUMP_FILE = "dump.json"
STACK_FILE = "stack.json"
CONSTRUCT_FILE = "construct.json"
#: Beside dump.json in a session of task "tensor": the tensors themselves.
TENSOR_DIR = "dump_tensor_data"

#: Left in an msprobe session's rank directory while the session is open, and
#: after it when the stage raised: a dump.json beside it is not a whole stage.
INCOMPLETE_MARKER = "session.incomplete"

# msprobe names: step{k}, rank{R}, proc{pid}.  The digit keeps our own
# step_{N} and step_unknown out.
_STEP_PREFIX = "step"
_RANK_PREFIX = "rank"
_STEP_GLOB = f"{_STEP_PREFIX}[0-9]*"
_RANK_GLOB = f"{_RANK_PREFIX}[0-9]*"
_PROC_GLOB = "proc[0-9]*"


#: The name of a module's entry in a dump.json (levels L0 and mix):
#: ``Module.{path}.{Class}.{forward|backward|parameters_grad}.{n}``.
MODULE_ENTRY = re.compile(
    r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward|parameters_grad)\.(?P<n>\d+)$"
)


class NotADump(ValueError):
    """A file that is not a readable msprobe dump.json; the message says which and why."""


# -- where a session's files are ------------------------------------------------


def step_dir(dump_path: Path, call: int) -> Path:
    """msprobe's ``step{call}`` directory under ``dump_path``."""
    return dump_path / f"{_STEP_PREFIX}{call}"


def rank_dir(step: Path, rank: int) -> Path:
    """The session directory of ``rank`` in msprobe's step directory ``step``."""
    return step / f"{_RANK_PREFIX}{rank}"


def session_dir(dump_path: Path, call: int, rank: int) -> Path:
    """Where msprobe writes the session it runs with ``dump_path``, step
    counter ``call`` and ``rank_id=rank``: ``{dump_path}/step{call}/rank{rank}``."""
    return rank_dir(step_dir(dump_path, call), rank)


def holds_sessions(path: Path) -> bool:
    """Whether ``path`` is an msprobe ``dump_path`` (for us a stage directory):
    it holds ``step{k}/rank{R}`` or ``step{k}/proc{pid}`` directories."""
    return any(path.glob(f"{_STEP_GLOB}/{_RANK_GLOB}")) or any(path.glob(f"{_STEP_GLOB}/{_PROC_GLOB}"))


def rank_dirs(step: Path) -> list[Path]:
    """The ``rank{R}`` session directories in msprobe's step directory ``step``, by name."""
    return sorted(step.glob(_RANK_GLOB))


def proc_dirs(step: Path) -> list[Path]:
    """The ``proc{pid}`` session directories (sessions without a rank) in ``step``, by name."""
    return sorted(step.glob(_PROC_GLOB))


def dump_file(session: Path) -> Path:
    """The ``dump.json`` of the session in directory ``session``."""
    return session / DUMP_FILE


def tensor_file(dump: Path, data_name: str) -> Path:
    """The file of one tensor of a tensor-task session, by its entry's ``data_name``."""
    return Path(dump).parent / TENSOR_DIR / data_name


def stack_file(dump: Path) -> Path:
    """The ``stack.json`` written beside ``dump`` (a session's ``dump.json``):
    for each entry of the dump, the Python stack it was called from.  It may
    not exist (msprobe's ``extra_info`` off, or a session cut off).  Raises
    ValueError when ``dump`` is not named ``dump.json``."""
    return _beside(dump, STACK_FILE)


def construct_file(dump: Path) -> Path:
    """The ``construct.json`` written beside ``dump``: each module or API
    entry's parent module (empty at level L1).  It may not exist, as for
    :func:`stack_file`; ValueError when ``dump`` is not named ``dump.json``."""
    return _beside(dump, CONSTRUCT_FILE)


def _beside(dump: Path, name: str) -> Path:
    if dump.name != DUMP_FILE:
        raise ValueError(f"{str(dump)!r} is not an msprobe {DUMP_FILE}; {name} is found beside a session's {DUMP_FILE}")
    return dump.with_name(name)


# -- a run's sessions -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionPlace:
    """One session of a run: ``{run}/step_{step}/{stage}/step{call}/rank{rank}``."""

    path: Path
    step: int
    stage: str
    call: int
    rank: int


def session_dirs(save_path: Path) -> list[Path]:
    """The rank directory of every msprobe session under ``save_path``, by path."""
    return sorted(
        session for stage in stage_dirs(save_path) for step in stage.glob(_STEP_GLOB) for session in rank_dirs(step)
    )


def session_places(save_path: Path) -> list[SessionPlace]:
    """Every session under ``save_path`` of a known step, with its place, by path."""
    places = []
    for session in session_dirs(save_path):
        stage = session.parent.parent
        step = step_of(stage.parent.name)
        call, rank = session.parent.name.removeprefix(_STEP_PREFIX), session.name.removeprefix(_RANK_PREFIX)
        if step is not None and call.isdigit() and rank.isdigit():
            places.append(SessionPlace(session, step, stage.name, int(call), int(rank)))
    return places


# -- open and cut-off sessions -----------------------------------------------------


def mark_incomplete(session: Path, why: str) -> None:
    """Say why the session in ``session`` is not a whole stage (replacing any earlier word)."""
    session.mkdir(parents=True, exist_ok=True)
    fd, aside = tempfile.mkstemp(dir=session, prefix=f".{INCOMPLETE_MARKER}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(why + "\n")
        os.replace(aside, session / INCOMPLETE_MARKER)
    except BaseException:
        Path(aside).unlink(missing_ok=True)
        raise


def mark_complete(session: Path) -> None:
    """The session in ``session`` stopped cleanly: take its marker away."""
    (session / INCOMPLETE_MARKER).unlink(missing_ok=True)


def incomplete_reason(session: Path) -> str | None:
    """Why the session in ``session`` is not a whole stage, or None when it is."""
    try:
        return (session / INCOMPLETE_MARKER).read_text(encoding="utf-8").strip() or "cut off"
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"its marker cannot be read ({exc.strerror or exc})"


def incomplete_sessions(save_path: Path) -> list[tuple[Path, str]]:
    """Every msprobe session under ``save_path`` that is not a whole stage, with why."""
    found = []
    for session in session_dirs(save_path):
        reason = incomplete_reason(session)
        if reason is not None:
            found.append((session, reason))
    return found


# -- reading a session ----------------------------------------------------------------


def read_dump(path: Path) -> dict[str, Any]:
    """The ``data`` of a dump.json: entry name -> what msprobe recorded, in
    execution order.  msprobe writes bare NaN/Infinity, which Python's json
    reads.  NotADump (a ValueError) when the file is missing or not a dump."""
    try:
        data = Record.loads(read_regular(path))["data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NotADump(f"{path} is not a readable msprobe {DUMP_FILE}: {exc}") from exc
    if not isinstance(data, dict):
        raise NotADump(f"{path}: its 'data' is not a mapping of API/module entries")
    return data


def read_stacks(dump: Path) -> dict[str, list[str]]:
    """Each entry's call stack from the ``stack.json`` beside ``dump``
    (``{"0": [[entry names], [frames]]}`` in msprobe 26.2, frames innermost
    first); empty when there is none or it is not that shape."""
    stacks: dict[str, list[str]] = {}
    for pair in _json_object(stack_file(dump)).values():
        if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], list) and isinstance(pair[1], list):
            stacks.update((name, pair[1]) for name in pair[0])
    return stacks


def read_construct(dump: Path) -> dict[str, Any]:
    """Each entry's enclosing module from the ``construct.json`` beside
    ``dump``; empty when there is none."""
    return _json_object(construct_file(dump))


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; empty when it is missing or not one
    (msprobe writes no stack.json or construct.json with ``extra_info: false``)."""
    try:
        value = Record.loads(read_regular(path))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
