"""The output tree every observer shares: ``{save_path}/step_{N}/{stage}/...``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ._errors import ConfigError
from ._events import StageEvent


TIMING_DIR = "timing"


def timing_log_path(save_path: Path, rank: int) -> Path:
    """The timing observer's JSON-lines file for one rank."""
    return save_path / TIMING_DIR / f"rank{rank}.jsonl"


def step_dir_name(step: int | None) -> str:
    """``step_3``, or ``step_unknown`` when the step could not be resolved."""
    return "step_unknown" if step is None else f"step_{step}"


def stage_output_dir(save_path: Path, event: StageEvent) -> Path:
    """Where observers write what they collect for one stage."""
    return save_path / step_dir_name(event.step) / event.stage


def prepare_output_dir(path: Path, key: str = "save_path") -> Path:
    """Create ``path`` and prove it is writable, so a bad path fails at
    install rather than at the first profiled step."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{key}: {str(path)!r} cannot be created ({exc.strerror or exc}); use a writable directory"
        ) from exc
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{key}: {str(path)!r} is not writable ({exc.strerror or exc}); use a writable directory") from exc
    return path
