"""Resolving observer classes by entry-point name or import path, and building them.

Built-in observers are registered in the same entry-point group
(``verl_events.observers``) a third-party package uses, so this module never
imports the ``observers`` package by name.

Every option is checked against the constructor's annotation before the
observer is created, the same way for built-in and third-party observers
(see :func:`check_options`).
"""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import types
import typing
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal, NamedTuple, Union

from verl_events.capture.arming import ArmedSelection
from verl_events.events.errors import ConfigError, ObserverSetupError
from verl_events.events.observer import HOOKS, InstallContext, Observer

from .interrupts import keeping_interrupts
from .schema import FRAMEWORK_KEYS, ObserverSpec

GROUP = "verl_events.observers"


def available_observers() -> dict[str, EntryPoint]:
    """Observer entry points installed in this environment, by name."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def writing_observers() -> tuple[list[tuple[str, type[Observer]]], list[str]]:
    """Each installed observer class that declares what it writes (``writes``), by its
    entry-point name (the first by name, for a class under two names), ordered by name;
    and a sentence for each entry point that failed to import (the others are still found)."""
    found: list[tuple[str, type[Observer]]] = []
    failed: list[str] = []
    seen: set[type] = set()
    for ep in sorted(entry_points(group=GROUP), key=lambda ep: ep.name):
        try:
            loaded = ep.load()
        except Exception as exc:  # another package's observer must not hide ours
            failed.append(f"entry point {ep.name!r} ({ep.value}) failed to import: {type(exc).__name__}: {exc}")
            continue
        if not (isinstance(loaded, type) and issubclass(loaded, Observer)) or loaded.writes is None:
            continue
        if loaded not in seen:
            seen.add(loaded)
            found.append((ep.name, loaded))
    return found, failed


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
        loaded = import_target(spec.target, f"{spec.where}._target_")
        where = f"{spec.where}._target_: {spec.target!r}"
    if not (isinstance(loaded, type) and issubclass(loaded, Observer)):
        raise ConfigError(f"{where} is {loaded!r}, not a subclass of verl_events.Observer")
    return loaded


def is_import_path(value: object) -> bool:
    """``package.module:name`` or ``package.module.name``, checked without importing it
    (the engine's module may still be importing when the observers are installed)."""
    if not isinstance(value, str):
        return False
    module, colon, name = value.partition(":")
    if not colon:
        module, _, name = value.rpartition(".")
    return bool(module and name) and all(part.isidentifier() for part in (*module.split("."), *name.split(".")))


def import_target(target: str, where: str) -> Any:
    """The object at ``target`` (``package.module:name`` or ``package.module.name``);
    ConfigError, naming ``where``, when it does not import."""
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(
            f"{where}: {target!r} is not an import path; use 'package.module:Class' or 'package.module.Class'"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or module_name.split(".")[0] != exc.name.split(".")[0]:
            raise ConfigError(
                f"{where}: module {module_name!r} of {target!r} failed to import: ModuleNotFoundError: {exc}"
            ) from exc
        raise ConfigError(
            f"{where}: no module {exc.name!r} on Python's path, so {target!r} does not import. An import path is "
            "looked up where the process imports from: its package installed, or the folder that holds "
            f"{exc.name.split('.')[0]}.py on PYTHONPATH (the current folder is on it for python -m and for "
            "verl-events check)"
        ) from exc
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
        p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    return names, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class _Refusal(NamedTuple):
    """Why a value does not fit an annotation: where inside the option
    (``""`` or ``"[2]"``), the value found there, and what is allowed."""

    path: str
    value: Any
    allowed: str


_SEQUENCES: tuple[Any, ...] = (list, tuple, collections.abc.Sequence, collections.abc.MutableSequence)
_SCALARS: dict[Any, tuple[str, str]] = {  # annotation: (allowed, plural for "a list of ...")
    bool: ("true or false", "true/false values"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
    type(None): ("null", "nulls"),
}


def _is_scalar(value: Any, hint: Any) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return value is None


def _checkable(hint: Any) -> bool:
    """Whether :func:`_refusal` knows ``hint``; anything else accepts every value."""
    origin = typing.get_origin(hint)
    # Tuples, not sets or dicts: an annotation need not be hashable.
    if hint in tuple(_SCALARS) or origin is Literal or hint in _SEQUENCES:
        return True
    if origin in (Union, types.UnionType):
        return all(_checkable(member) for member in typing.get_args(hint))
    if origin in _SEQUENCES:
        args = typing.get_args(hint)
        return all(_checkable(arg) for arg in args if arg is not Ellipsis)
    return False


def _describe(hint: Any, *, plural: bool = False) -> str:
    origin = typing.get_origin(hint)
    if hint in tuple(_SCALARS):
        return _SCALARS[hint][plural]
    if origin is Literal:
        values = ", ".join(map(repr, typing.get_args(hint)))
        return f"values from {values}" if plural else f"one of {values}"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(member, plural=plural) for member in typing.get_args(hint))
    args = [arg for arg in typing.get_args(hint) if arg is not Ellipsis]
    if origin is tuple and args and len(typing.get_args(hint)) == len(args):
        items = ", ".join(_describe(arg) for arg in args)
        return f"lists of {len(args)} items ({items})" if plural else f"a list of {len(args)} items ({items})"
    what = f"lists of {_describe(args[0], plural=True)}" if args else "lists"
    return what if plural else "a list" + what[len("lists") :]


def _refusal(value: Any, hint: Any) -> _Refusal | None:
    """None if ``value`` fits ``hint`` (a :func:`_checkable` annotation), else why not."""
    origin = typing.get_origin(hint)
    if hint in tuple(_SCALARS):
        return None if _is_scalar(value, hint) else _Refusal("", value, _describe(hint))
    if origin is Literal:
        # 1 == True, so a literal matches only a value of its own type.
        if any(value == allowed and type(value) is type(allowed) for allowed in typing.get_args(hint)):
            return None
        return _Refusal("", value, _describe(hint))
    if origin in (Union, types.UnionType):
        refusals = []
        for member in typing.get_args(hint):
            refusal = _refusal(value, member)
            if refusal is None:
                return None
            refusals.append(refusal)
        # A list whose shape fits a member but one item does not: name the item.
        inner = [r for r in refusals if r.path]
        return inner[0] if len(inner) == 1 else _Refusal("", value, _describe(hint))
    if not isinstance(value, (list, tuple)):
        return _Refusal("", value, _describe(hint))
    args = typing.get_args(hint)
    if origin is tuple and args and Ellipsis not in args:
        if len(value) != len(args):
            return _Refusal("", value, _describe(hint))
        item_hints = list(args)
    else:
        item_hints = [args[0] if args else Any] * len(value)
    for index, (item, item_hint) in enumerate(zip(value, item_hints, strict=True)):
        refusal = _refusal(item, item_hint) if _checkable(item_hint) else None
        if refusal is not None:
            return refusal._replace(path=f"[{index}]{refusal.path}")
    return None


def _option_hints(cls: type[Observer]) -> dict[str, Any]:
    """The constructor's annotations, resolved.  When one cannot be (a name
    imported only under TYPE_CHECKING), the others are resolved one by one
    and that option goes unchecked."""
    init = cls.__init__
    try:
        return typing.get_type_hints(init)
    except Exception:
        pass
    hints: dict[str, Any] = {}
    module_globals = getattr(init, "__globals__", {})
    for name, annotation in getattr(init, "__annotations__", {}).items():
        try:
            one = types.SimpleNamespace(__annotations__={name: annotation})
            hints.update(typing.get_type_hints(one, module_globals))
        except Exception:
            continue
    return hints


def check_options(cls: type[Observer], options: Mapping[str, Any]) -> None:
    """Check each option against the annotation of its constructor parameter.

    bool takes only true/false; int an int, not a bool; float an int or a
    float; str a string; ``list[X]``, ``tuple[X, ...]`` and ``Sequence[X]``
    a list whose items check as X; ``Literal[...]`` one of its values; a
    union any of its members.  None is accepted where the annotation allows
    it or the parameter's default is None.  Anything else (no annotation,
    ``Any``, a class, a mapping) is accepted unchecked.  Options that fall
    into ``**kwargs`` are checked against its annotation.  ConfigError
    names the option, the value and what is allowed.
    """
    hints = _option_hints(cls)
    params = inspect.signature(cls).parameters
    var_keyword = next((p.name for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    for key, value in options.items():
        param = params.get(key)
        if param is not None and param.kind is not inspect.Parameter.POSITIONAL_ONLY:
            hint, default = hints.get(key, Any), param.default
        elif var_keyword is not None:
            hint, default = hints.get(var_keyword, Any), inspect.Parameter.empty
        else:
            continue  # an unknown option: refused before this by build_observer
        if not _checkable(hint) or (value is None and default is None):
            continue
        refusal = _refusal(value, hint)
        if refusal is not None:
            raise ConfigError(f"option {key}{refusal.path}: {refusal.value!r} is not allowed; use {refusal.allowed}")


def observer_origin(spec: ObserverSpec) -> str:
    """Where an ``observers:`` entry's class comes from, in words."""
    if spec.name is None:
        return f"_target_ {spec.target}"
    ep = available_observers().get(spec.name)
    if ep is None:
        return f"entry point {spec.name!r} (not installed)"
    dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "an unknown distribution"
    return f"entry point {spec.name!r} -> {ep.value}, from {dist}"


def check_hook_names(cls: type[Observer], where: str) -> None:
    """ObserverSetupError when ``cls`` defines a method named like a hook
    (``on_...``) that is not one: the bus would never call it, so a
    misspelled hook would fail silently.  Helpers named otherwise are fine."""
    for klass in cls.__mro__:
        if klass is Observer or klass is object:
            continue
        for name, value in vars(klass).items():
            if not name.startswith("on_") or name in HOOKS:
                continue
            if inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod)):
                raise ObserverSetupError(
                    f"{where}: {klass.__module__}.{klass.__qualname__}.{name} is named like a hook but is not one, "
                    f"so it would never be called; the hooks are {', '.join(HOOKS)}: rename it to one of them, "
                    "or give a helper a name that does not start with on_"
                )


def build_observer(spec: ObserverSpec, context: InstallContext, *, set_up: bool = True) -> Observer:
    """Construct, configure and (unless ``set_up`` is False) set up one observer.

    ConfigError for bad options (naming the option and the allowed ones),
    unknown ones first, then each value against its annotation
    (:func:`check_options`), before the constructor runs;
    ObserverSetupError, naming the observer, when its constructor or
    ``setup`` fails for another reason; KeyboardInterrupt when Ctrl-C
    arrived meanwhile, even if it surfaced inside as another exception (see
    :func:`~verl_events.setup.interrupts.keeping_interrupts`).
    """
    with keeping_interrupts(f"building {spec.where} ({spec.label})"):
        return _build_observer(spec, context, set_up=set_up)


def _build_observer(spec: ObserverSpec, context: InstallContext, *, set_up: bool) -> Observer:
    cls = observer_class(spec)
    check_hook_names(cls, f"{spec.where} ({spec.label})")
    allowed, takes_any = _option_names(cls)
    unknown = sorted(set(spec.options) - set(allowed))
    if unknown and not takes_any:
        raise ConfigError(
            f"{spec.where} ({spec.label}): unknown option {', '.join(map(repr, unknown))}; "
            f"{cls.__name__} takes {', '.join(allowed) or 'no options'}, "
            f"and every observer takes {', '.join(k for k in FRAMEWORK_KEYS if k != '_target_')}"
        )
    where = f"{spec.where} ({spec.label})"
    try:
        check_options(cls, spec.options)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    observer: Observer = _guarded(where, "could not be created", lambda: cls(**spec.options))
    observer.name = spec.label
    observer.selection = spec.selection
    observer.optional = spec.optional
    if spec.trigger is not None:
        if not observer.captures:
            raise ConfigError(
                f"{where}: trigger: anomaly arms capture observers (msprobe, torch_profiler, nsys, npu, "
                f"or one whose class sets captures = True); {spec.label!r} does not capture"
            )
        observer.selection = ArmedSelection.wrap(spec.selection, spec.trigger, spec.label)
    if spec.priority is not None:
        observer.priority = spec.priority
    if set_up:
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
