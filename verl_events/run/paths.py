"""The output tree every observer shares: ``{save_path}/step_{N}/{stage}/...``.

This module owns the tree's names (``step_{N}``, ``step_unknown``, a replay's
``{stage}.replay``); what an
observer writes inside a stage directory is the observer's own format, in its
own module (msprobe's sessions: :mod:`verl_events.observers.msprobe.layout`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from verl_events.events.errors import ConfigError
from verl_events.events.stages import StageEvent

_STEP_PREFIX = "step_"
_UNKNOWN_STEP = "step_unknown"

#: A glob that matches every step directory's name.
STEP_DIR_GLOB = f"{_STEP_PREFIX}*"

#: What ``save_path`` may hold besides a path: ``{run}``, the run's id ...
RUN_PLACEHOLDER = "{run}"
#: ... and ``{node}``, the node's (:func:`verl_events.run.identity.node_name`), for a folder per node.
NODE_PLACEHOLDER = "{node}"
#: The link beside a ``.../{run}`` folder to the run that claimed its folder last.
LATEST_LINK = "latest"
#: The driver's console output kept in a run folder (the demo's verl engine writes it; a
#: launcher may): ``diagnose`` reads Ray's memory-monitor kills there, ``gather`` brings it.
DRIVER_LOG = "trainer.log"

#: How docs and messages spell a stage directory.
STAGE_DIR_TEMPLATE = "{save_path}/step_{N}/{stage}"
#: The end of a replay's directory name, beside its stage's: ``step_{N}/{stage}.replay``.
REPLAY_SUFFIX = ".replay"


def step_dir_name(step: int | None) -> str:
    """``step_3``, or ``step_unknown`` when the step could not be resolved."""
    return _UNKNOWN_STEP if step is None else f"{_STEP_PREFIX}{step}"


def step_of(name: str) -> int | None:
    """The step a step directory's name stands for (``step_3`` -> 3); None
    for ``step_unknown`` and for any name that is not a step directory."""
    number = name.removeprefix(_STEP_PREFIX)
    return int(number) if number != name and number.isdigit() else None


def step_dirs(save_path: Path) -> list[Path]:
    """The step directories under ``save_path`` (``step_unknown`` included), by name."""
    return sorted(path for path in Path(save_path).glob(STEP_DIR_GLOB) if path.is_dir())


def stage_dirs(save_path: Path) -> list[Path]:
    """Every stage directory under ``save_path``, by path."""
    return sorted(path for step in step_dirs(save_path) for path in step.iterdir() if path.is_dir())


def stage_dir(save_path: Path, step: int | None, stage: str) -> Path:
    """The directory of one stage of one step: ``{save_path}/step_{N}/{stage}``."""
    return Path(save_path) / step_dir_name(step) / stage


def stage_output_dir(save_path: Path, event: StageEvent) -> Path:
    """Where observers write what they collect for one stage; a replay's
    outputs go beside the stage's, in ``{stage}.replay``."""
    return stage_dir(save_path, event.step, replay_dir_name(event.stage) if event.replay else event.stage)


def replay_dir_name(stage: str) -> str:
    """The directory name of a stage's replay: ``{stage}.replay``."""
    return stage + REPLAY_SUFFIX


def replayed_stage(name: str) -> str | None:
    """The stage a directory name is the replay of, or None."""
    return name[: -len(REPLAY_SUFFIX)] if name.endswith(REPLAY_SUFFIX) else None


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
