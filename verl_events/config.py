"""Turning a config into observers, without installing them.

What tools that check or show a config need (``verl-events check``, the
demos): read and validate a config, list and build observers exactly as
:func:`verl_events.install` builds them (:func:`build_observers`), and find
the conflicts it would refuse, and the presets a config may name
(:data:`PRESETS`; ``Config.preset`` and ``ObserverSpec.preset`` say where an
observer came from).  Observer authors check their options with
:func:`check_count` and ConfigError.  Training code needs
none of this; it calls :func:`verl_events.install`.
"""

from __future__ import annotations

from verl_events.capture.arming import ArmedSelection, armed_stages, check_triggers
from verl_events.capture.replay import REPLAYABLE
from verl_events.events.errors import CONFIG_FILE_LIMIT, check_count, read_config_text
from verl_events.events.selection import parse_numbers
from verl_events.setup.from_verl import from_verl_config, is_verl_config
from verl_events.setup.install import build_observers, check_exclusive_resources, nothing_to_observe, start_run_folder
from verl_events.setup.presets import PRESETS, Preset
from verl_events.setup.registry import (
    available_observers,
    build_observer,
    import_target,
    is_import_path,
    observer_origin,
    writing_observers,
)
from verl_events.setup.schema import Config, ObserverSpec, is_bare_name, load_config, read_config

__all__ = [
    "CONFIG_FILE_LIMIT",
    "PRESETS",
    "REPLAYABLE",
    "ArmedSelection",
    "armed_stages",
    "Config",
    "ObserverSpec",
    "Preset",
    "available_observers",
    "build_observer",
    "build_observers",
    "check_count",
    "check_exclusive_resources",
    "check_triggers",
    "from_verl_config",
    "import_target",
    "is_bare_name",
    "is_import_path",
    "is_verl_config",
    "load_config",
    "nothing_to_observe",
    "observer_origin",
    "parse_numbers",
    "read_config",
    "read_config_text",
    "start_run_folder",
    "writing_observers",
]
