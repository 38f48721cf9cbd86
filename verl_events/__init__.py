"""verl_events: stage events for verl workers, delivered to any number of observers.

Names are imported on first use (PEP 562), so that importing the package —
as verl's plugin loader does in every process — costs next to nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._bus import stage_begin, stage_end
    from ._config import Config, ObserverSpec, load_config
    from ._emit import emits_stage, stage
    from ._errors import ConfigError, ObserverError, ObserverSetupError, VerlEventsWarning
    from ._events import KNOWN_STAGES, STAGE_ROLES, StageEnd, StageEvent, StageReport
    from ._install import Installation, current_installation, install
    from ._observer import InstallContext, Observer
    from ._paths import prepare_output_dir, stage_output_dir, step_dir_name
    from ._registry import available_observers
    from ._resolve import add_model_paths, current_step, find_rank, reset_model_paths, set_step
    from ._selection import Selection
    from .verl_bridge import VerlBridgeError, install_verl_bridge, uninstall_verl_bridge

_HOMES = {
    "stage_begin": "._bus",
    "stage_end": "._bus",
    "Config": "._config",
    "ObserverSpec": "._config",
    "load_config": "._config",
    "emits_stage": "._emit",
    "stage": "._emit",
    "ConfigError": "._errors",
    "ObserverError": "._errors",
    "ObserverSetupError": "._errors",
    "VerlEventsWarning": "._errors",
    "KNOWN_STAGES": "._events",
    "STAGE_ROLES": "._events",
    "StageEnd": "._events",
    "StageEvent": "._events",
    "StageReport": "._events",
    "Installation": "._install",
    "current_installation": "._install",
    "install": "._install",
    "InstallContext": "._observer",
    "Observer": "._observer",
    "prepare_output_dir": "._paths",
    "stage_output_dir": "._paths",
    "step_dir_name": "._paths",
    "available_observers": "._registry",
    "add_model_paths": "._resolve",
    "current_step": "._resolve",
    "find_rank": "._resolve",
    "reset_model_paths": "._resolve",
    "set_step": "._resolve",
    "Selection": "._selection",
    "VerlBridgeError": ".verl_bridge",
    "install_verl_bridge": ".verl_bridge",
    "uninstall_verl_bridge": ".verl_bridge",
}

__all__ = [
    "KNOWN_STAGES",
    "STAGE_ROLES",
    "Config",
    "ConfigError",
    "InstallContext",
    "Installation",
    "Observer",
    "ObserverError",
    "ObserverSetupError",
    "ObserverSpec",
    "Selection",
    "StageEnd",
    "StageEvent",
    "StageReport",
    "VerlBridgeError",
    "VerlEventsWarning",
    "add_model_paths",
    "available_observers",
    "current_installation",
    "current_step",
    "emits_stage",
    "find_rank",
    "install",
    "install_verl_bridge",
    "load_config",
    "prepare_output_dir",
    "reset_model_paths",
    "set_step",
    "stage",
    "stage_output_dir",
    "stage_begin",
    "stage_end",
    "step_dir_name",
    "uninstall_verl_bridge",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'verl_events' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute read
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
