"""Where observers write under ``save_path``, and which run owns it.

Observer authors build their paths with :func:`stage_output_dir` and
:func:`prepare_output_dir` (also exported by :mod:`verl_events`); the tools
that read a run back (``report``, ``check``, ``compare``) find its parts
with the other functions here, so writers and readers share one layout.
"""

from __future__ import annotations

from ._paths import (
    INCOMPLETE_MARKER,
    TIMING_DIR,
    incomplete_reason,
    incomplete_sessions,
    mark_complete,
    mark_incomplete,
    prepare_output_dir,
    run_files,
    session_dirs,
    stage_output_dir,
    step_dir_name,
    timing_log_files,
    timing_log_path,
)
from ._run import RUN_FILE, RUN_ID_ENV, SavePathTaken, claim_save_path, owner_of, refuse_other_runs, run_id

__all__ = [
    "INCOMPLETE_MARKER",
    "RUN_FILE",
    "RUN_ID_ENV",
    "TIMING_DIR",
    "SavePathTaken",
    "claim_save_path",
    "incomplete_reason",
    "incomplete_sessions",
    "mark_complete",
    "mark_incomplete",
    "owner_of",
    "prepare_output_dir",
    "refuse_other_runs",
    "run_files",
    "run_id",
    "session_dirs",
    "stage_output_dir",
    "step_dir_name",
    "timing_log_files",
    "timing_log_path",
]
