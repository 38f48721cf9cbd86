"""The tree observers write under ``save_path``, and which run owns it.

Observer authors build their paths with :func:`stage_output_dir` and
:func:`prepare_output_dir` (also exported by :mod:`verl_events`); the tools
that read a run back walk it with :func:`step_dirs`, :func:`stage_dirs` and
:func:`step_of`.  What an observer writes inside the tree is its own format,
defined beside its writer: msprobe's sessions in
:mod:`verl_events.observers.msprobe.layout`, the timing log in
:mod:`verl_events.observers.timing`, the anomaly record in
:mod:`verl_events.observers.sentinel.record`.

A run owns its save_path (:mod:`verl_events.run.identity`): install refuses a
save_path holding another run's files (what each observer lists in
:meth:`~verl_events.Observer.outputs`), and the installation claims it,
once, before the first stage any writing observer receives.

Every reader opens a run's files through :func:`open_regular` and :func:`read_regular`
(:mod:`verl_events.run.files`): regular files only, checked without blocking, whole files
read within a stated bound (:data:`LOG_READ_LIMIT`).
"""

from __future__ import annotations

import warnings
from typing import Any

from verl_events.events.run_id import RUN_ID_ENV, run_id
from verl_events.run.files import LOG_READ_LIMIT, RunFileRefused, open_regular, read_regular
from verl_events.run.identity import (
    NODE_ENV,
    RUN_FILE,
    SavePathTaken,
    claim_save_path,
    node_name,
    owner_of,
    refuse_other_runs,
)
from verl_events.run.paths import (
    DRIVER_LOG,
    LATEST_LINK,
    NODE_PLACEHOLDER,
    REPLAY_SUFFIX,
    RUN_PLACEHOLDER,
    STAGE_DIR_TEMPLATE,
    STEP_DIR_GLOB,
    prepare_output_dir,
    replay_dir_name,
    replayed_stage,
    stage_dir,
    stage_dirs,
    stage_output_dir,
    step_dir_name,
    step_dirs,
    step_of,
)
from verl_events.setup.moved import NOT_MOVED, moved_name

__all__ = [
    "DRIVER_LOG",
    "LATEST_LINK",
    "LOG_READ_LIMIT",
    "NODE_ENV",
    "NODE_PLACEHOLDER",
    "REPLAY_SUFFIX",
    "RUN_FILE",
    "RUN_PLACEHOLDER",
    "RUN_ID_ENV",
    "RunFileRefused",
    "STAGE_DIR_TEMPLATE",
    "STEP_DIR_GLOB",
    "SavePathTaken",
    "claim_save_path",
    "node_name",
    "open_regular",
    "owner_of",
    "prepare_output_dir",
    "read_regular",
    "refuse_other_runs",
    "replay_dir_name",
    "replayed_stage",
    "run_id",
    "stage_dir",
    "stage_dirs",
    "stage_output_dir",
    "step_dir_name",
    "step_dirs",
    "step_of",
]

# Names this module exported in 0.2 that now live with their format's
# writer.  They resolve, with a DeprecationWarning, until 0.3.
_MOVED = {
    "INCOMPLETE_MARKER": "verl_events.observers.msprobe.layout",
    "incomplete_reason": "verl_events.observers.msprobe.layout",
    "incomplete_sessions": "verl_events.observers.msprobe.layout",
    "mark_complete": "verl_events.observers.msprobe.layout",
    "mark_incomplete": "verl_events.observers.msprobe.layout",
    "session_dirs": "verl_events.observers.msprobe.layout",
    "TIMING_DIR": "verl_events.observers.timing",
    "timing_log_files": "verl_events.observers.timing",
    "timing_log_path": "verl_events.observers.timing",
}


def __getattr__(name: str) -> Any:
    value = moved_name(__name__, name, _MOVED)
    if value is not NOT_MOVED:
        return value
    if name == "run_files":
        warnings.warn(
            "verl_events.layout.run_files goes in 0.3: each observer lists its own files "
            "(Observer.outputs(save_path)), and install checks them all",
            DeprecationWarning,
            stacklevel=2,
        )
        return _run_files
    raise AttributeError(f"module 'verl_events.layout' has no attribute {name!r}")


def _run_files(save_path: Any) -> list[Any]:
    """0.2's run_files: msprobe sessions and timing logs, as those observers declare them."""
    from verl_events.setup.registry import writing_observers

    declared = dict(writing_observers()[0])
    return [path for name in ("msprobe", "timing") for path in declared[name].writes.files(save_path)]  # type: ignore[union-attr]
