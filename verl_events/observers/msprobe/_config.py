"""Reading and checking an msprobe ``config.json`` before training starts.

msprobe validates its config only when the debugger is built, prints the
reason to stdout and raises exceptions with a Chinese prefix.  We check the
common mistakes first, with errors that name the file and the field, and
rewrite the config into the form the observer needs (no ``dump_path``, no
``step`` list).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from verl_events import ConfigError, VerlEventsWarning
from verl_events.config import is_bare_name, read_config_text
from verl_events.layout import STAGE_DIR_TEMPLATE

from .layout import DUMP_FILE

# Tasks the PyTorch debugger runs (msprobe 26.2 Const.TORCH_TASK_LIST, minus
# acc_check, which has no PyTorch processor and fails at construction).
TASKS = ("statistics", "tensor", "structure", "diff_check", "nan_check")
# Names from older msprobe docs that are CLIs or gone in 26.x.
_NOT_DEBUGGER_TASKS = ("overflow_check", "free_benchmark", "run_ut", "grad_probe", "acc_check", "exception_dump")
LEVELS = ("L0", "L1", "L2", "mix", "debug")
MODEL_LEVELS = ("L0", "mix")  # levels that hook modules, so start() needs the model

# msprobe rejects any path outside this set once it is resolved (FileCheckConst.FILE_VALID_PATTERN).
_PATH_OK = re.compile(r"^[a-zA-Z0-9_.:/-]+$")

#: The packaged config used when ``config_path`` is left out.
DEFAULT_CONFIG_NAME = "statistics_L1"


@dataclass(frozen=True, slots=True)
class MsprobeSettings:
    """A checked config: where it came from, its task and level, and the
    JSON to hand msprobe."""

    source: str
    task: str
    level: str
    config: dict[str, Any]

    @property
    def needs_model(self) -> bool:
        return self.level in MODEL_LEVELS


def check_msprobe_path(path: Path, key: str) -> None:
    """ConfigError if msprobe would refuse ``path`` for its characters."""
    resolved = os.path.realpath(path)
    if not _PATH_OK.match(resolved):
        raise ConfigError(
            f"{key}: {str(path)!r} (resolved to {resolved!r}) contains characters msprobe rejects; "
            "msprobe allows only letters, digits and _ . : / - in paths (no spaces, '+', '@', '=' "
            "or non-ASCII)"
        )


#: msprobe configs shipped with the package, named by ``config_path: <name>``.
PACKAGED = Path(__file__).parent / "configs"


def packaged_configs() -> list[str]:
    """The names ``config_path`` may give instead of a path: ``statistics_L1``, ..."""
    return sorted(path.stem for path in PACKAGED.glob("*.json"))


def config_file(config_path: str | os.PathLike[str]) -> Path:
    """The file ``config_path`` names: a packaged config for a bare name (no
    folder, no extension), else the path itself.  ConfigError for a bare name
    that is not packaged."""
    text = os.fspath(config_path)
    if not is_bare_name(text):
        return Path(text)
    packaged = PACKAGED / f"{text}.json"
    if not packaged.is_file():
        raise ConfigError(
            f"config_path: {text!r} is not a file path nor a config shipped with verl-events; "
            f"use a path to an msprobe config.json, or one of {', '.join(packaged_configs())}"
        )
    return packaged


def read_msprobe_config(config_path: str | os.PathLike[str] | None) -> MsprobeSettings:
    """Load and check ``config_path``: a path, a packaged config's name
    (:func:`packaged_configs`), or None for statistics at level L1."""
    if config_path is None:
        return replace(read_msprobe_config(DEFAULT_CONFIG_NAME), source="(default: statistics, L1)")
    path = config_file(config_path)
    where = f"config_path {str(path)!r}"
    if path.suffix != ".json":
        raise ConfigError(f"{where}: msprobe reads only .json config files")
    text = read_config_text(path, where)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a JSON object with 'task' and 'level'; found {type(data).__name__}")
    if path.parent != PACKAGED:  # ours sit in site-packages; msprobe reads a copy (see _api), never them
        check_msprobe_path(path, "config_path")

    task = data.get("task", "statistics")
    if task not in TASKS:
        hint = " (that is an msprobe command-line tool, not a debugger task)" if task in _NOT_DEBUGGER_TASKS else ""
        raise ConfigError(f"{where}: field 'task' is {task!r}{hint}; allowed: {', '.join(TASKS)}")
    level = data.get("level", "L1")
    if level not in LEVELS:
        raise ConfigError(f"{where}: field 'level' is {level!r}; allowed: {', '.join(LEVELS)}")

    config = dict(data)
    if config.pop("dump_path", None) is not None:
        warnings.warn(
            f"{where}: field 'dump_path' is ignored; dumps go to {STAGE_DIR_TEMPLATE} "
            f"so that every stage gets its own {DUMP_FILE}",
            VerlEventsWarning,
            stacklevel=2,
        )
    if config.get("step"):
        warnings.warn(
            f"{where}: field 'step' {config['step']!r} is ignored; select steps with the observer's "
            "'steps' key (an exhausted msprobe step list would switch msprobe off for the whole run)",
            VerlEventsWarning,
            stacklevel=2,
        )
    config["step"] = []
    return MsprobeSettings(str(path), task, level, config)
