"""``verl-events check CONFIG``: a config validated and its observers built, nothing written.

The observers are built exactly as install builds them, without being set up:
no tool is started and nothing is written.  An observer whose tool is missing
is an error, unless it is marked optional.  Exit codes: 0 the config is
valid, 2 it is not (one line naming the key and what is allowed).
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events import ConfigError, Observer, ObserverSetupError
from verl_events.config import (
    REPLAYABLE,
    ArmedSelection,
    Config,
    ObserverSpec,
    armed_stages,
    build_observers,
    load_config,
    nothing_to_observe,
    observer_origin,
)
from verl_events.layout import RUN_PLACEHOLDER

from . import shell

__all__ = ["add_command", "command"]


def add_command(commands: Any) -> None:
    """Add ``check`` to the ``verl-events`` parser's subcommands."""
    check = commands.add_parser("check", help="validate a config and list the observers it builds")
    check.add_argument("config", help="a YAML config file, or a preset's name (always_on)")
    check.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. observers.0.steps=[1,2]")
    check.set_defaults(run_command=command)


def command(args: argparse.Namespace) -> int:
    """Validate ``args.config`` and print the observers it builds; 0, or 2 for a bad config."""
    shell.import_from_here()
    return shell.run(
        args,
        lambda: _build(args.config, args.overrides),
        (ConfigError, ObserverSetupError),
        text=lambda checked: _print_checked(checked, args.config),
    )


@dataclass(frozen=True, slots=True)
class _Checked:
    """A config and the observers it builds, one per enabled spec."""

    config: Config
    specs: list[ObserverSpec]
    built: list[Observer]


def _build(source: str, overrides: list[str]) -> _Checked:
    """The config loaded and its observers built exactly as install builds them, not set up.
    Every warning, the config's own included, is one line of check's output, also when the
    config is refused: Python's default would print our source file and line with it."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            config = load_config(source, overrides)
            specs = [spec for spec in config.observers if spec.enabled]
            built = build_observers(config, set_up=False)
        except (ConfigError, ObserverSetupError):
            _print_warnings(said)
            raise
    _print_warnings(said)
    return _Checked(config, specs, built)


def _print_warnings(said: list[warnings.WarningMessage]) -> None:
    for warning in said:
        shell.warn(str(warning.message))


def _print_checked(checked: _Checked, source: str) -> None:
    """The save_path, what replay does, each observer and what the save_path holds now."""
    config = checked.config
    save_path: Path | None = config.save_path
    if config.latest is not None:  # save_path: .../{run}: this check's own id names no real folder
        save_path = config.latest.resolve() if config.latest.is_symlink() else None
        shown = f"{config.latest.parent / RUN_PLACEHOLDER} (a folder per run; latest: {save_path or 'none yet'})"
    else:
        shown = str(config.save_path)
    print(f"save_path: {shown}  strict: {config.strict}")
    _print_replay(config, checked.built)
    if not checked.built:
        shell.warn(nothing_to_observe(source))
    for spec, observer in zip(checked.specs, checked.built, strict=True):
        _print_observer(spec, observer)
    per_run = config.latest is not None
    for note in save_path_notes(save_path, per_run=per_run) if save_path is not None else []:
        print(f"note: {note}")
    for problem in save_path_problems(config.save_path):
        shell.warn(problem)
    if any(spec.target is not None for spec in checked.specs):
        print(
            "note: the _target_ observers were imported and built to check them: their modules' code ran here, "
            "as it runs at install (check a config from someone else as you would run its code)"
        )


#: Folders of the system, where a run's files never belong.
SYSTEM_FOLDERS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/proc", "/run", "/sbin", "/sys", "/usr", "/var")


def save_path_problems(save_path: Path) -> list[str]:
    """A sentence for a save_path no run should write into: an existing file, or a system
    folder (or a folder inside /proc, /sys or /dev)."""
    resolved = save_path.resolve()
    if resolved.exists() and not resolved.is_dir():
        return [f"save_path {str(save_path)!r} is an existing file; observers write a folder there: choose a folder"]
    inside = resolved.parents[-2] if len(resolved.parents) > 1 else resolved  # its top-level folder
    if str(resolved) in SYSTEM_FOLDERS or str(inside) in ("/proc", "/sys", "/dev"):
        return [
            f"save_path {str(save_path)!r} is the system folder {str(resolved)!r}; observers would write into it: "
            "choose a folder of your own"
        ]
    return []


def _print_replay(config: Config, built: list[Observer]) -> None:
    """What replay does after an anomaly, when an observer is armed with a trigger."""
    armed = armed_stages(built) if any(isinstance(o.selection, ArmedSelection) for o in built) else frozenset()
    if armed is None or armed:
        if config.replay is False:
            print("replay: off (replay: false); armed observers capture the steps after an anomaly only")
        else:
            replayed = ", ".join(sorted(REPLAYABLE if armed is None else REPLAYABLE & armed)) or "none of verl's"
            print(f"replay: after an anomaly, stages run again for the armed observers: {replayed}")
            print("  (and stages declared @emits_stage(..., replayable=True))")


def _print_observer(spec: ObserverSpec, observer: Observer) -> None:
    """An observer's line (priority and selection), where it comes from, its options and its own description."""
    sel = observer.selection
    steps = _fmt(sel.steps)
    if isinstance(sel, ArmedSelection) and spec.trigger is not None:
        limit = spec.trigger.max_captures
        after = (
            f"{spec.trigger.capture_steps} after each anomaly "
            f"({f'at most {limit} time' + ('s' if limit > 1 else '') if limit else 'no limit'})"
        )
        steps = f"{_fmt(sel.fixed_steps)} and {after}" if sel.fixed_steps else after
    print(
        f"  {observer.name:<20} priority={observer.priority:<4} steps={steps} "
        f"stages={_fmt(sel.stages)} roles={_fmt(sel.roles)} ranks={_fmt(sel.ranks)}"
    )
    print(f"    from {observer_origin(spec)}")
    if spec.options:
        print("    options: " + ", ".join(f"{key}={value!r}" for key, value in spec.options.items()))
    described = observer.describe()
    if described:
        print(f"    {described}")


def save_path_notes(save_path: Path, *, per_run: bool = False) -> list[str]:
    """What a new run would meet in ``save_path``: another run's files (of
    every tool of :func:`.tools.tools`), cut-off msprobe sessions.  With
    ``per_run`` (``save_path: .../{run}``), ``save_path`` is the latest run's
    folder, and a new run gets a folder of its own instead."""
    from verl_events.layout import owner_of
    from verl_events.observers.msprobe import layout as msprobe_layout

    from .tools import run_holds

    notes = []
    held = [holding.describe() for holding in run_holds(save_path)]
    if held:
        owner = owner_of(save_path)
        listed = held[0] if len(held) == 1 else f"{', '.join(held[:-1])} and {held[-1]}"
        of = f"run {owner!r}" if owner else "an earlier run"
        if per_run:
            notes.append(
                f"the latest run's folder holds {listed} of {of}; a new run gets a folder of its own, "
                "a process of that run joins it there"
            )
        else:
            notes.append(
                f"save_path holds {listed} of {of}; a new run there is refused, a process of that run may join it"
            )
    cut = msprobe_layout.incomplete_sessions(save_path)
    notes += [f"{path} is an incomplete msprobe session: {why}" for path, why in cut]
    return notes


def _fmt(values: frozenset[object] | None) -> str:
    return "all" if values is None else "[" + ",".join(map(str, sorted(values, key=str))) + "]"
