"""Finding the dump ``verl-events compare`` reads on each side.

A side is a run directory (our ``{save_path}``), a stage directory, a rank
directory or an msprobe dump file; a :class:`Pick` (``--step/--stage/--rank``,
``--call``) chooses the dump in a run directory by our run layout
(:mod:`verl_events.layout`).  Below a stage directory the layout is msprobe's
(:mod:`verl_events.observers.msprobe.layout`, the one owner of its files).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events.layout import stage_dir, stage_dirs, step_dirs, step_of
from verl_events.observers.msprobe import layout

__all__ = ["CompareInputError", "Pick", "dump_entries", "resolve_dump"]


class CompareInputError(ValueError):
    """A dump cannot be found or read; the message says which and why (exit 2)."""


@dataclass(frozen=True, slots=True)
class Pick:
    """Which dump to take from a run directory."""

    step: int | None = None
    stage: str | None = None
    rank: int = 0
    call: int = 0


def resolve_dump(path: Path, pick: Pick) -> Path:
    """The ``dump.json`` that ``path`` and ``pick`` designate, or CompareInputError.

    Below a stage directory the layout is msprobe's, as
    :mod:`verl_events.observers.msprobe.layout` describes it."""
    if path.is_file():
        if path.name != layout.DUMP_FILE:
            raise CompareInputError(f"{path} is not an msprobe {layout.DUMP_FILE}")
        path = path.parent
    if not path.is_dir():
        raise CompareInputError(f"{path} does not exist")
    if steps := step_dirs(path):  # a run directory
        if pick.step is None or pick.stage is None:
            stages = sorted({p.name for p in stage_dirs(path)})
            raise CompareInputError(
                f"{path} is a run directory; choose a dump with --step and --stage "
                f"(steps here: {', '.join(p.name for p in steps)}; stages: {', '.join(stages)})"
            )
        picked = stage_dir(path, pick.step, pick.stage)
        if not picked.is_dir():
            raise CompareInputError(f"{picked} does not exist: step {pick.step} of stage {pick.stage!r} was not dumped")
        path = picked
    elif step_of(path.name) is not None and pick.stage is not None:  # a step directory: --stage picks in it
        picked = path / pick.stage
        if not picked.is_dir():
            here = ", ".join(sorted(p.name for p in path.iterdir() if p.is_dir()))
            raise CompareInputError(
                f"{picked} does not exist: stage {pick.stage!r} was not dumped (stages here: {here})"
            )
        path = picked
    if layout.holds_sessions(path):  # a stage directory: msprobe's dump_path
        path = layout.step_dir(path, pick.call)
    if ranks := layout.rank_dirs(path):  # msprobe's step directory
        rank_dir = layout.rank_dir(path, pick.rank)
        if not rank_dir.is_dir():
            raise CompareInputError(f"{rank_dir} does not exist; ranks here: {', '.join(p.name for p in ranks)}")
        path = rank_dir
    elif procs := layout.proc_dirs(path):
        raise CompareInputError(
            f"{path} holds msprobe {', '.join(p.name for p in procs)} dumps, written without a rank; "
            f"pass the {layout.DUMP_FILE} itself, e.g. {layout.dump_file(procs[0])}"
        )
    dump = layout.dump_file(path)
    reason = layout.incomplete_reason(path)
    if reason is not None:
        raise CompareInputError(
            f"{path} is an incomplete msprobe session, not a whole stage: {reason}; "
            "compare needs two whole stages (dump this step again)"
        )
    if not dump.is_file():
        raise CompareInputError(
            f"{path} has no {layout.DUMP_FILE}: the stage was not dumped here, or the run stopped before msprobe "
            f"wrote it (msprobe writes {layout.DUMP_FILE} when a session stops)"
        )
    return dump


def dump_entries(path: Path) -> dict[str, Any]:
    """The entries of the dump file at ``path``, in execution order, read by
    msprobe's layout (:func:`~verl_events.observers.msprobe.layout.read_dump`);
    CompareInputError when it is missing or not a dump."""
    try:
        return layout.read_dump(path)
    except layout.NotADump as exc:
        raise CompareInputError(str(exc)) from exc
