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
        raise ConfigError(
            f"{key}: {str(path)!r} is not writable ({exc.strerror or exc}); use a writable directory"
        ) from exc
    return path


#: Left in an msprobe session's rank directory while the session is open, and
#: after it when the stage raised: a dump.json beside it is not a whole stage.
INCOMPLETE_MARKER = "session.incomplete"


def mark_incomplete(rank_dir: Path, why: str) -> None:
    """Say why the session in ``rank_dir`` is not a whole stage (replacing any earlier word)."""
    rank_dir.mkdir(parents=True, exist_ok=True)
    fd, aside = tempfile.mkstemp(dir=rank_dir, prefix=f".{INCOMPLETE_MARKER}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(why + "\n")
        os.replace(aside, rank_dir / INCOMPLETE_MARKER)
    except BaseException:
        Path(aside).unlink(missing_ok=True)
        raise


def mark_complete(rank_dir: Path) -> None:
    (rank_dir / INCOMPLETE_MARKER).unlink(missing_ok=True)


def incomplete_reason(rank_dir: Path) -> str | None:
    """Why the session in ``rank_dir`` is not a whole stage, or None when it is."""
    try:
        return (rank_dir / INCOMPLETE_MARKER).read_text(encoding="utf-8").strip() or "cut off"
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"its marker cannot be read ({exc.strerror or exc})"


def incomplete_sessions(save_path: Path) -> list[tuple[Path, str]]:
    """Every msprobe session under ``save_path`` that is not a whole stage, with why."""
    found = []
    for marker in sorted(save_path.glob(f"step_*/*/step*/rank*/{INCOMPLETE_MARKER}")):
        reason = incomplete_reason(marker.parent)
        if reason is not None:
            found.append((marker.parent, reason))
    return found


def session_dirs(save_path: Path) -> list[Path]:
    """The rank directory of every msprobe session under ``save_path``."""
    return sorted(save_path.glob("step_*/*/step*/rank*"))


def timing_log_files(save_path: Path) -> list[Path]:
    """Every rank's timing log of a run, by rank file name."""
    return sorted((Path(save_path) / TIMING_DIR).glob("rank*.jsonl"))


def run_files(save_path: Path) -> list[Path]:
    """What a run leaves in ``save_path``: msprobe session directories and timing logs."""
    return session_dirs(save_path) + timing_log_files(save_path)
