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

from ._arming import ArmedSelection, armed_stages, check_triggers
from ._checks import check_count
from ._claim import start_run_folder
from ._config import Config, ObserverSpec, is_bare_name, load_config, read_config
from ._install import build_observers, check_exclusive_resources, nothing_to_observe
from ._presets import PRESETS, Preset
from ._registry import available_observers, build_observer, import_target, is_import_path, observer_origin
from ._replay import REPLAYABLE
from ._selection import parse_numbers
from ._verl_config import from_verl_config, is_verl_config

__all__ = [
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
    "start_run_folder",
]
