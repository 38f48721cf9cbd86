"""verl_events: stage events for verl workers, delivered to any number of observers.

The names here serve two audiences:

* training code: :func:`stage`, :func:`emits_stage`, :func:`set_step`,
  :func:`add_model_paths`, :func:`install` (its handle, :class:`Installation`,
  and :func:`current_installation`), and the events;
* observer authors: :class:`Observer`, :class:`InstallContext`,
  :class:`Selection`, :func:`find_rank`, the events, the ``anomaly``
  signal with its :class:`AnomalyEvent`, the ``hang`` signal with its
  :class:`HangEvent`, the output-path helpers and the errors; and, to see
  each weight sync's tensors pass, :func:`watch_payloads` with its
  :class:`Payload` and :class:`PayloadWatcher`; for a log of one's own,
  :class:`Record` (one JSON style, one parser) and :func:`stage_header`.

Tools that read or check a config import :mod:`verl_events.config`; the
on-disk layout lives in :mod:`verl_events.layout`; verl's worker classes are
bridged by :mod:`verl_events.verl_bridge`; test fixtures use
:mod:`verl_events.testing`.

Names are imported on first use (PEP 562), so that importing the package —
as verl's plugin loader does in every process — costs next to nothing.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl_events.bus.emit import emits_stage, stage
    from verl_events.bus.progress import LoopEnded, ProgressWatcher, unwatch_progress, watch_progress
    from verl_events.bus.resolve import add_model_paths, find_rank, set_step
    from verl_events.bus.weights import Payload, PayloadWatcher, unwatch_payloads, watch_payloads
    from verl_events.events.anomaly import AnomalyEvent, anomaly, send_anomaly
    from verl_events.events.errors import ConfigError, ObserverError, ObserverSetupError, VerlEventsWarning
    from verl_events.events.hang import HangEvent, hang
    from verl_events.events.observer import InstallContext, Observer, Writes
    from verl_events.events.record import Record, stage_header
    from verl_events.events.selection import Selection
    from verl_events.events.signals import stage_begin, stage_end
    from verl_events.events.stages import DRIVER_RANK, STAGE_ROLES, StageEnd, StageEvent, StageReport, rank_name
    from verl_events.run.paths import prepare_output_dir, stage_output_dir
    from verl_events.setup.install import Installation, current_installation, install

_HOMES = {
    "AnomalyEvent": ".events.anomaly",
    "anomaly": ".events.anomaly",
    "send_anomaly": ".events.anomaly",
    "HangEvent": ".events.hang",
    "hang": ".events.hang",
    "stage_begin": ".events.signals",
    "stage_end": ".events.signals",
    "emits_stage": ".bus.emit",
    "stage": ".bus.emit",
    "ConfigError": ".events.errors",
    "ObserverError": ".events.errors",
    "ObserverSetupError": ".events.errors",
    "VerlEventsWarning": ".events.errors",
    "DRIVER_RANK": ".events.stages",
    "STAGE_ROLES": ".events.stages",
    "rank_name": ".events.stages",
    "StageEnd": ".events.stages",
    "StageEvent": ".events.stages",
    "StageReport": ".events.stages",
    "Installation": ".setup.install",
    "current_installation": ".setup.install",
    "install": ".setup.install",
    "InstallContext": ".events.observer",
    "Observer": ".events.observer",
    "Writes": ".events.observer",
    "Record": ".events.record",
    "stage_header": ".events.record",
    "prepare_output_dir": ".run.paths",
    "stage_output_dir": ".run.paths",
    "add_model_paths": ".bus.resolve",
    "find_rank": ".bus.resolve",
    "set_step": ".bus.resolve",
    "Selection": ".events.selection",
    "Payload": ".bus.weights",
    "PayloadWatcher": ".bus.weights",
    "unwatch_payloads": ".bus.weights",
    "watch_payloads": ".bus.weights",
    "LoopEnded": ".bus.progress",
    "ProgressWatcher": ".bus.progress",
    "unwatch_progress": ".bus.progress",
    "watch_progress": ".bus.progress",
}

# verl_events.config.load_config(...) works without importing the submodule first.
_SUBMODULES = frozenset({"config", "layout", "verl_bridge", "testing", "observers", "apps"})

# Names this package exported before 0.2, and where they live now.  They
# still resolve, with a DeprecationWarning, until 0.3.
_MOVED = {
    "Config": "verl_events.config",
    "ObserverSpec": "verl_events.config",
    "load_config": "verl_events.config",
    "available_observers": "verl_events.config",
    "step_dir_name": "verl_events.layout",
    "current_step": "verl_events.bus.resolve",
    "reset_model_paths": "verl_events.bus.resolve",
    "VerlBridgeError": "verl_events.verl_bridge",
    "install_verl_bridge": "verl_events.verl_bridge",
    "uninstall_verl_bridge": "verl_events.verl_bridge",
}

__all__ = [
    "DRIVER_RANK",
    "STAGE_ROLES",
    "AnomalyEvent",
    "ConfigError",
    "HangEvent",
    "InstallContext",
    "Installation",
    "LoopEnded",
    "Observer",
    "ObserverError",
    "ObserverSetupError",
    "Payload",
    "PayloadWatcher",
    "ProgressWatcher",
    "Record",
    "Selection",
    "StageEnd",
    "StageEvent",
    "StageReport",
    "VerlEventsWarning",
    "Writes",
    "add_model_paths",
    "anomaly",
    "current_installation",
    "emits_stage",
    "find_rank",
    "hang",
    "install",
    "prepare_output_dir",
    "rank_name",
    "send_anomaly",
    "set_step",
    "stage",
    "stage_begin",
    "stage_end",
    "stage_header",
    "stage_output_dir",
    "unwatch_payloads",
    "unwatch_progress",
    "watch_payloads",
    "watch_progress",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home, __name__), name)
        globals()[name] = value  # the next lookup is a plain attribute read
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _MOVED:
        from verl_events.setup.moved import moved_name

        return moved_name(__name__, name, _MOVED)
    if name == "KNOWN_STAGES":
        warnings.warn(
            "verl_events.KNOWN_STAGES is gone in 0.3; use frozenset(verl_events.STAGE_ROLES)",
            DeprecationWarning,
            stacklevel=2,
        )
        from verl_events.events.stages import STAGE_ROLES

        return frozenset(STAGE_ROLES)
    raise AttributeError(f"module 'verl_events' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
