"""Where msprobe writes a dump session's files, for the observer that points
msprobe there and for the tools that read the dumps back (compare, triage).

Our run layout (:mod:`verl_events.layout`) ends at a stage directory,
``{save_path}/step_{N}/{stage}``.  The observer hands that directory to
msprobe as its ``dump_path``, and msprobe builds the rest itself (msprobe
26.2, ``BaseService.create_dirs``)::

    {dump_path}/step{k}/rank{R}/dump.json        one session; k is msprobe's step counter
                               /stack.json       (the observer sets it to the stage's call
                               /construct.json   within the global step, normally 0) and R
                                                 the rank the observer passes
    {dump_path}/step{k}/proc{pid}/...            msprobe's name when it has no rank (dumps
                                                 not written by our observer)

msprobe writes ``stack.json`` and ``construct.json`` only with its
``extra_info`` on (the default), so a reader checks that they exist.
Standard library only: importing this module never imports msprobe or torch.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CONSTRUCT_FILE",
    "DUMP_FILE",
    "STACK_FILE",
    "construct_file",
    "dump_file",
    "holds_sessions",
    "proc_dirs",
    "rank_dir",
    "rank_dirs",
    "session_dir",
    "stack_file",
    "step_dir",
]

DUMP_FILE = "dump.json"
STACK_FILE = "stack.json"
CONSTRUCT_FILE = "construct.json"

# msprobe names: step{k}, rank{R}, proc{pid}.  The digit keeps our own
# step_{N} and step_unknown out.
_STEP_GLOB = "step[0-9]*"
_RANK_GLOB = "rank[0-9]*"
_PROC_GLOB = "proc[0-9]*"


def step_dir(dump_path: Path, call: int) -> Path:
    """msprobe's ``step{call}`` directory under ``dump_path``."""
    return dump_path / f"step{call}"


def rank_dir(step: Path, rank: int) -> Path:
    """The session directory of ``rank`` in msprobe's step directory ``step``."""
    return step / f"rank{rank}"


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
