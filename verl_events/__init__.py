"""verl_events: stage events for verl workers, delivered to any number of observers."""

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
