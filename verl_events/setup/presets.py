"""Presets: a named set of observers that one line switches on.

``preset: always_on`` in a config puts the preset's observers before the
config's own ``observers:``.  The name alone also stands where a config file
is expected (``VERL_EVENTS_CONFIG=always_on``, ``verl-events check
always_on``, ``install("always_on")``): it is the config ``{preset: always_on}``.

An ``observers:`` entry whose ``name`` is one of the preset's is merged into
that observer, its keys winning: that is how a preset observer's option,
selection or ``enabled`` is changed.  Every other entry runs beside the
preset's, after them.  Without ``save_path`` the preset's own applies (a
folder per run, so the same line works for every run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from verl_events.events.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Preset:
    """A preset: its name, what it is for, its default ``save_path`` and its
    ``observers:`` entries, in order."""

    name: str
    summary: str
    save_path: str
    observers: tuple[Mapping[str, Any], ...]


#: The cheap watchers: what a run should always have on, so that a crash, a hang,
#: a NaN or a rollout/trainer gap leaves something to read (docs/performance.md: their cost).
#: The memory observer samples its peaks on its own thread (``peak: sampled``): reading them in
#: the hooks of every stage cost the set a third of its time on verl's trainer.
ALWAYS_ON = Preset(
    name="always_on",
    summary="timing, watchdog, sentinel (its default rules), mismatch and memory (peak: sampled), "
    "on every stage of every step",
    save_path="outputs/profile/{run}",
    observers=(
        *(MappingProxyType({"name": name}) for name in ("timing", "watchdog", "sentinel", "mismatch")),
        MappingProxyType({"name": "memory", "peak": "sampled"}),
    ),
)

PRESETS: Mapping[str, Preset] = MappingProxyType({ALWAYS_ON.name: ALWAYS_ON})


def preset_named(value: Any, key: str = "preset") -> Preset:
    """The preset ``value`` names; ConfigError naming ``key``, the value and the presets there are."""
    if isinstance(value, str) and value in PRESETS:
        return PRESETS[value]
    raise ConfigError(f"{key}: {value!r} is not a preset; available: {describe_presets()}")


def describe_presets() -> str:
    """Every preset's name and summary, for messages: ``always_on (timing, ...)``."""
    return "; ".join(f"{p.name} ({p.summary})" for p in PRESETS.values())


def is_preset_name(value: str) -> bool:
    return value in PRESETS


#: One observers: entry as parsing needs it: where errors point, the entry, and the preset it comes from.
Placed = tuple[str, Any, str | None]


def expand(preset: Preset, entries: Sequence[Any]) -> list[Placed]:
    """The preset's observers with ``entries`` merged in by name, then the other entries.

    ``where`` is ``observers[i]`` for an entry of the config (also when it
    was merged into a preset observer: the config's keys are the ones that
    can be wrong) and ``preset NAME's observers[i]`` for a preset observer
    the config leaves as it is.  ConfigError when two entries of the config
    name the same preset observer.
    """
    names = [entry["name"] for entry in preset.observers]
    merged: dict[str, tuple[int, Mapping[str, Any]]] = {}
    extra: list[Placed] = []
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, Mapping) and "_target_" not in entry else None
        if not isinstance(name, str) or name not in names:
            extra.append((f"observers[{index}]", entry, None))
            continue
        if name in merged:
            raise ConfigError(
                f"observers[{index}] ({name}): observers[{merged[name][0]}] already changes preset {preset.name}'s "
                f"{name}; put both entries' keys in one entry (an entry named like a preset observer is merged "
                "into it, not run beside it)"
            )
        merged[name] = (index, entry)
    placed: list[Placed] = []
    for index, entry in enumerate(preset.observers):
        name = entry["name"]
        if name in merged:
            at, changes = merged[name]
            placed.append((f"observers[{at}]", {**entry, **changes}, preset.name))
        else:
            placed.append((f"preset {preset.name}'s observers[{index}]", dict(entry), preset.name))
    return placed + extra
