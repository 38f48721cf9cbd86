"""Loading and validating the ``observers:`` configuration.

Schema::

    preset: always_on            # optional: a named set of observers, before the list below
    save_path: outputs/profile/{run}   # root of every observer's output ({run}: this run's id)
    strict: false                # raise instead of logging observer problems
    max_failures: 5              # switch an observer off after this many failures (null: never)
    replay: true                 # false: no replay of forward-only stages for armed observers
    observers:
      - name: msprobe            # an entry point of group verl_events.observers
        # or _target_: my_pkg.observers:MyObserver
        steps: [1, "4-6"]        # steps / stages / roles / ranks: null = all
        stages: [actor_update]
        priority: 0              # higher begins first and ends last
        enabled: true
        optional: false          # true: a missing tool is a warning in check and strict mode
        config_path: dump.json   # anything else is an option of the observer

verl's own form (``global_profiler`` plus the role blocks' ``profiler.enable``)
is accepted too and mapped onto the same observers.

A preset (``_presets``) adds its observers and a default ``save_path``; an
entry named like one of its observers changes that observer.  A preset's
name stands for a config file too: ``load_config("always_on")``.

Sources: a YAML file path, a mapping, or an OmegaConf config; overrides are
``key=value`` dotlist strings (``observers.0.steps=[1,2]``), values parsed
as YAML.  Every error names the key, the bad value and what is allowed.

Paths: an observer option whose name ends in ``_path`` (msprobe's
``config_path``) names an input, so a relative one in a YAML file is taken
from the file's folder, as docker-compose does (a bare name, without folder
or extension, is left alone: it names something, like a packaged config);
``save_path`` is where the run writes, so it stays relative to the working
directory, as Hydra's output folders do.  A mapping keeps the working
directory for both.
``{run}`` in ``save_path`` is this run's id (:func:`verl_events.layout.run_id`,
the same in every process of the run): each run gets its own folder, and
``latest`` beside it links to the run that claimed its folder last.
``{node}`` is the node's (:func:`verl_events.layout.node_name`): a folder per
node, which ``verl-events gather`` collects through Ray.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from verl_events.capture.arming import TRIGGER_KEYS, Trigger, parse_trigger
from verl_events.events.errors import ConfigError, check_count, read_config_text
from verl_events.events.run_id import run_id
from verl_events.events.selection import Selection
from verl_events.run.identity import node_name
from verl_events.run.paths import LATEST_LINK, NODE_PLACEHOLDER, RUN_PLACEHOLDER

from .from_verl import from_verl_config, is_verl_config
from .presets import Placed, describe_presets, expand, is_preset_name, preset_named

DEFAULT_SAVE_PATH = "outputs/profile"
DEFAULT_MAX_FAILURES = 5
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
TOP_LEVEL_KEYS = ("preset", "save_path", "strict", "max_failures", "replay", "observers")
SELECTION_KEYS = ("steps", "stages", "roles", "ranks")
FRAMEWORK_KEYS = ("name", "_target_", *SELECTION_KEYS, "priority", "enabled", "optional", *TRIGGER_KEYS)


@dataclass(frozen=True, slots=True)
class ObserverSpec:
    """One validated ``observers:`` entry.  ``options`` go to the observer's
    constructor; ``where`` locates the entry in error messages."""

    where: str
    name: str | None
    target: str | None
    selection: Selection
    priority: int | None
    enabled: bool
    options: Mapping[str, Any] = field(default_factory=dict)
    trigger: Trigger | None = None  # trigger: anomaly, see _arming
    optional: bool = False  # its tool may be missing: a warning, not an error
    preset: str | None = None  # the preset this observer comes from, if any

    @property
    def label(self) -> str:
        return self.name or self.target or "?"


@dataclass(frozen=True, slots=True)
class Config:
    """A validated config.  ``save_path`` has its ``{run}`` filled in;
    ``latest`` is the link to point at it once the run claims it (when
    ``save_path`` ended in ``{run}``), else None."""

    save_path: Path
    strict: bool
    observers: tuple[ObserverSpec, ...]
    max_failures: int | None = DEFAULT_MAX_FAILURES
    latest: Path | None = None
    replay: bool | None = None  # None: replay when an observer is armed (verl_events.capture.replay)
    preset: str | None = None  # the preset the config named, if any


def load_config(source: Any = None, overrides: Iterable[str] = ()) -> Config:
    """Build a :class:`Config` from a YAML path, a preset's name, a mapping or
    an OmegaConf object (None means an empty config), then apply dotlist overrides."""
    raw = read_config(source)
    overrides = list(overrides)
    if overrides:
        raw = _apply_overrides(raw, overrides)
    return parse_config(raw)


def read_config(source: Any) -> dict[str, Any]:
    """The raw mapping of a YAML path, a mapping or an OmegaConf object, not yet checked.

    A string that is a bare name (no folder, no extension) names a preset:
    ``"always_on"`` is ``{"preset": "always_on"}``.  A bare name that is no
    preset is read as a file when one exists, else ConfigError.
    """
    if source is None:
        return {}
    if isinstance(source, str) and is_bare_name(source):
        if is_preset_name(source):
            return {"preset": source}
        if not Path(source).is_file():
            raise ConfigError(
                f"config {source!r} is neither a file nor a preset; give a file's path (./{source} for a file "
                f"without extension) or a preset: {describe_presets()}"
            )
    if isinstance(source, (str, os.PathLike)):
        return _inputs_beside(_read_yaml(Path(source)), Path(source).parent)
    if _is_omegaconf(source):
        from omegaconf import OmegaConf

        source = OmegaConf.to_container(source, resolve=True)
    if isinstance(source, Mapping):
        return dict(source)
    raise ConfigError(
        f"config: {type(source).__name__} is not a config; pass a YAML file path, a dict or an OmegaConf DictConfig"
    )


def _is_omegaconf(value: Any) -> bool:
    return type(value).__module__.startswith("omegaconf")


#: The most values a config may hold once YAML's aliases are expanded: real configs hold a
#: few hundred; a few lines of aliases can expand to billions (an "alias bomb"), which every
#: later walk over the config would follow.
CONFIG_VALUE_LIMIT = 100_000


def load_yaml(text: str, what: str) -> Any:
    """``text`` parsed as YAML (safe: no Python objects), refused with ConfigError naming
    ``what`` when its aliases expand past :data:`CONFIG_VALUE_LIMIT` values, refer to
    themselves, or it nests deeper than the parser follows.  yaml.YAMLError propagates."""
    try:
        data = yaml.safe_load(text)
        values = _expanded_values(data, {})
    except RecursionError:
        raise ConfigError(f"{what} is nested too deep to read") from None
    if values > CONFIG_VALUE_LIMIT:
        raise ConfigError(
            f"{what}: its YAML aliases expand to more than {CONFIG_VALUE_LIMIT} values (or refer to "
            "themselves); a config holds a few hundred. Write the values out, or use fewer aliases"
        )
    return data


def _expanded_values(value: Any, sizes: dict[int, int]) -> int:
    """How many values ``value`` holds with every alias expanded, counted without expanding
    it: a part that several aliases share is sized once (``sizes``, by id) and counted at
    each use; a part that holds itself counts as past the limit."""
    if not isinstance(value, (dict, list)):
        return 1
    known = sizes.get(id(value))
    if known is not None:
        return known
    sizes[id(value)] = CONFIG_VALUE_LIMIT + 1  # seen again while being sized: it holds itself
    total = 1
    for item in value.values() if isinstance(value, dict) else value:
        total = min(total + _expanded_values(item, sizes), CONFIG_VALUE_LIMIT + 1)
    sizes[id(value)] = total
    return total


def _read_yaml(path: Path) -> dict[str, Any]:
    text = read_config_text(path, f"config file {str(path)!r}")
    try:
        data = load_yaml(text, f"config file {str(path)!r}")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}: {problem}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping with keys "
            f"{', '.join(TOP_LEVEL_KEYS)}; found a {type(data).__name__}"
        )
    return data


def _apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.create(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not key=value, e.g. observers.0.steps=[1,2]")
        try:
            value = load_yaml(text, f"override {item!r}")
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: the value {text!r} is not valid YAML") from exc
        try:
            OmegaConf.update(cfg, key.strip(), value, merge=True, force_add=True)
        except (OmegaConfBaseException, IndexError, KeyError, ValueError) as exc:
            # OmegaConf appends "full_key: ..." / "object_type=..." lines: keep its first line.
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"override {item!r} cannot be applied: {reason}") from exc
    result = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(result, dict)
    return {str(k): v for k, v in result.items()}


def parse_config(raw: Mapping[str, Any]) -> Config:
    """Validate a plain mapping (see the module docstring for the schema).

    A mapping with verl's ``global_profiler`` block is first translated to
    ours (see ``_verl_config``); a ``preset`` is then expanded (``_presets``).
    """
    preset = None if raw.get("preset") is None else preset_named(raw["preset"])
    if is_verl_config(raw):
        translated = from_verl_config(raw)
        profiler = raw["global_profiler"]
        if preset is not None and not profiler.get("save_path"):
            del translated["save_path"]  # verl's default gives way to the preset's
        raw = translated
    unknown = sorted(set(map(str, raw)) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigError(f"config: unknown key {', '.join(map(repr, unknown))}; allowed: {', '.join(TOP_LEVEL_KEYS)}")
    strict = raw.get("strict", False)
    if not isinstance(strict, bool):
        raise ConfigError(f"strict: {strict!r} is not allowed; use true or false")
    save_path = raw.get("save_path", preset.save_path if preset is not None else DEFAULT_SAVE_PATH)
    if not isinstance(save_path, (str, os.PathLike)) or not str(save_path):
        raise ConfigError(f"save_path: {save_path!r} is not allowed; use a directory path")
    save_path, latest = _fill_save_path(str(save_path))
    max_failures = check_count(raw.get("max_failures", DEFAULT_MAX_FAILURES), "max_failures", null="for never")
    replay = raw.get("replay")
    if replay is not None and not isinstance(replay, bool):
        raise ConfigError(f"replay: {replay!r} is not allowed; use true or false (or leave it out: on when armed)")
    entries = raw.get("observers") or []
    if not isinstance(entries, list):
        raise ConfigError(f"observers: {entries!r} is not allowed; use a list of observer entries")
    placed: list[Placed] = (
        expand(preset, entries) if preset is not None else [(f"observers[{i}]", e, None) for i, e in enumerate(entries)]
    )
    specs = tuple(_parse_observer(entry, where, strict, preset=name) for where, entry, name in placed)
    if replay and not any(spec.trigger is not None and spec.enabled for spec in specs):
        raise ConfigError(
            "replay: true replays a stage for the capture observers an anomaly arms, but no observer has "
            "trigger: anomaly; add trigger: anomaly to a capture observer (msprobe, torch_profiler, nsys, npu), "
            "or remove replay"
        )
    return Config(
        save_path=save_path,
        strict=strict,
        observers=specs,
        max_failures=max_failures,
        latest=latest,
        replay=replay,
        preset=None if preset is None else preset.name,
    )


def _parse_observer(entry: Any, where: str, strict: bool, preset: str | None = None) -> ObserverSpec:
    if not isinstance(entry, Mapping):
        raise ConfigError(
            f"{where}: {entry!r} is not allowed; each observer is a mapping with "
            "'name' (an entry point) or '_target_' (an import path)"
        )
    name, target = entry.get("name"), entry.get("_target_")
    if (name is None) == (target is None):
        raise ConfigError(
            f"{where}: give exactly one of 'name' (an entry point such as msprobe) "
            f"or '_target_' (an import path such as my_pkg.observers:MyObserver); got {dict(entry)!r}"
        )
    for key, value in (("name", name), ("_target_", target)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(f"{where}.{key}: {value!r} is not allowed; use a non-empty string")
    priority = entry.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ConfigError(f"{where}.priority: {priority!r} is not allowed; use an integer")
    enabled, optional = entry.get("enabled", True), entry.get("optional", False)
    for key, value in (("enabled", enabled), ("optional", optional)):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}.{key}: {value!r} is not allowed; use true or false")
    selection = Selection.parse(**{key: entry.get(key) for key in SELECTION_KEYS}, where=where, strict=strict)
    options = MappingProxyType({str(k): v for k, v in entry.items() if k not in FRAMEWORK_KEYS})
    trigger = parse_trigger(entry, where)
    return ObserverSpec(
        where=where,
        name=name,
        target=target,
        selection=selection,
        priority=priority,
        enabled=enabled,
        options=options,
        trigger=trigger,
        optional=optional,
        preset=preset,
    )


def _fill_save_path(text: str) -> tuple[Path, Path | None]:
    """``save_path`` with ``{run}`` and ``{node}`` filled in, and the ``latest`` link
    when ``{run}`` is its last part; ConfigError for any other placeholder."""
    for found in _PLACEHOLDER.findall(text):
        if found not in (RUN_PLACEHOLDER, NODE_PLACEHOLDER):
            raise ConfigError(
                f"save_path: {text!r} holds {found!r}, which is not a placeholder; use {RUN_PLACEHOLDER} "
                "(this run's id, the same in every process of the run; a time would differ between processes) "
                f"or {NODE_PLACEHOLDER} (the node's: Ray's node id, else the host name)"
            )
    if NODE_PLACEHOLDER in text:
        text = text.replace(NODE_PLACEHOLDER, node_name())
    if RUN_PLACEHOLDER not in text:
        return Path(text), None
    filled = Path(text.replace(RUN_PLACEHOLDER, run_id()))
    latest = filled.parent / LATEST_LINK if Path(text).name == RUN_PLACEHOLDER else None
    return filled, latest


def _inputs_beside(raw: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A config file's relative input paths (observer options ending in
    ``_path``; verl's ``precision_debugger.config_path``), taken from ``folder``."""
    if is_verl_config(raw):
        profiler = raw.get("global_profiler")
        tools = profiler.get("global_tool_config") if isinstance(profiler, Mapping) else None
        debugger = tools.get("precision_debugger") if isinstance(tools, Mapping) else None
        if isinstance(profiler, Mapping) and isinstance(tools, Mapping) and isinstance(debugger, Mapping):
            fixed = {k: _beside(v, folder) if k == "config_path" else v for k, v in debugger.items()}
            tools = {**tools, "precision_debugger": fixed}
            raw = {**raw, "global_profiler": {**profiler, "global_tool_config": tools}}
        return raw
    entries = raw.get("observers")
    if not isinstance(entries, list):
        return raw
    anchored = [
        {k: _beside(v, folder) if str(k).endswith("_path") else v for k, v in entry.items()}
        if isinstance(entry, Mapping)
        else entry
        for entry in entries
    ]
    return {**raw, "observers": anchored}


def _beside(value: Any, folder: Path) -> Any:
    """``value`` taken from ``folder`` when it is a relative path string.  A
    bare name (no folder, no extension) is a name, not a path: it is left
    alone (msprobe's ``config_path: statistics_L1`` names a packaged config)."""
    if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
        return value
    # Absolute: a process that re-reads a copy of the config elsewhere finds the same file.
    return value if is_bare_name(value) else str(folder.resolve() / value)


def is_bare_name(value: str) -> bool:
    """Whether ``value`` is a name rather than a path: no folder, no extension,
    not ``.``/``..``/``~`` (``statistics_L1``, not ``statistics_L1.json`` or ``configs/x``)."""
    return "/" not in value and os.sep not in value and not Path(value).suffix and not value.startswith((".", "~"))
