"""Resolving observer classes by entry-point name or import path, and building them.

Built-in observers are registered in the same entry-point group
(``verl_events.observers``) a third-party package uses, so this module never
imports the ``observers`` package by name.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from ._config import FRAMEWORK_KEYS, ObserverSpec
from ._errors import ConfigError, ObserverSetupError
from ._observer import InstallContext, Observer

GROUP = "verl_events.observers"


def available_observers() -> dict[str, EntryPoint]:
    """Observer entry points installed in this environment, by name."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def observer_class(spec: ObserverSpec) -> type[Observer]:
    """The class an ``observers:`` entry names; ConfigError if it cannot be found."""
    if spec.name is not None:
        found = available_observers()
        ep = found.get(spec.name)
        if ep is None:
            raise ConfigError(
                f"{spec.where}.name: {spec.name!r} is not an installed observer; "
                f"available: {', '.join(sorted(found)) or '(none)'}. "
                f"Install the package that provides it, or use _target_: with an import path"
            )
        try:
            loaded = ep.load()
        except Exception as exc:
            dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
            raise ConfigError(
                f"{spec.where}.name: entry point {spec.name!r} ({ep.value}) of distribution "
                f"{dist!r} failed to import: {type(exc).__name__}: {exc}"
            ) from exc
        where = f"{spec.where}.name: entry point {spec.name!r} ({ep.value})"
    else:
        assert spec.target is not None
        loaded = _import_target(spec.target, f"{spec.where}._target_")
        where = f"{spec.where}._target_: {spec.target!r}"
    if not (isinstance(loaded, type) and issubclass(loaded, Observer)):
        raise ConfigError(
            f"{where} is {loaded!r}, not a subclass of verl_events.Observer"
        )
    return loaded


def _import_target(target: str, where: str) -> Any:
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(
            f"{where}: {target!r} is not an import path; use 'package.module:Class' or 'package.module.Class'"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(
            f"{where}: module {module_name!r} of {target!r} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{where}: {module_name!r} has no attribute {attr!r}") from None
    return obj


def _option_names(cls: type[Observer]) -> tuple[list[str], bool]:
    """(keyword options the constructor takes, whether it takes **kwargs)."""
    params = inspect.signature(cls).parameters.values()
    names = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    return names, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def build_observer(spec: ObserverSpec, context: InstallContext) -> Observer:
    """Construct, configure and set up one observer.

    ConfigError for bad options (naming the option and the allowed ones);
    ObserverSetupError, naming the observer, when its constructor or
    ``setup`` fails for another reason.
    """
    cls = observer_class(spec)
    allowed, takes_any = _option_names(cls)
    unknown = sorted(set(spec.options) - set(allowed))
    if unknown and not takes_any:
        raise ConfigError(
            f"{spec.where} ({spec.label}): unknown option {', '.join(map(repr, unknown))}; "
            f"{cls.__name__} takes {', '.join(allowed) or 'no options'}, "
            f"and every observer takes {', '.join(k for k in FRAMEWORK_KEYS if k != '_target_')}"
        )
    where = f"{spec.where} ({spec.label})"
    observer: Observer = _guarded(where, "could not be created", lambda: cls(**spec.options))
    observer.name = spec.label
    observer.selection = spec.selection
    if spec.priority is not None:
        observer.priority = spec.priority
    setup_observer(observer, context, where=where)
    return observer


def setup_observer(observer: Observer, context: InstallContext, *, where: str) -> None:
    """Call ``observer.setup``, naming the observer in any error."""
    _guarded(where, "failed to set up", lambda: observer.setup(context))


def _guarded(where: str, what: str, action: Any) -> Any:
    try:
        return action()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    except Exception as exc:
        raise ObserverSetupError(f"{where} {what}: {type(exc).__name__}: {exc}") from exc
