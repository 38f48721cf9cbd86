"""``install()``: turn a config into connected observers, and the handle that undoes it."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from verl_events.bus.dispatch import Dispatcher
from verl_events.capture.arming import ArmedSelection, TriggerClock, arm, armed_stages, check_triggers
from verl_events.capture.replay import ReplayPlan, activate, active
from verl_events.events.errors import ConfigError, ObserverError, ObserverSetupError, VerlEventsWarning
from verl_events.events.observer import InstallContext, Observer
from verl_events.events.process import PROCESS
from verl_events.run.claim import SavePathClaim, point_at, refuse_other_runs_files, writes_outputs
from verl_events.run.paths import prepare_output_dir

from .interrupts import keeping_interrupts, put_back_handlers
from .registry import build_observer, check_hook_names, setup_observer
from .schema import Config, load_config

logger = logging.getLogger("verl_events")

_lock = threading.Lock()


class Installation:
    """The observers of one :func:`install`, connected to the bus.

    Closing disconnects them, then calls each observer's ``close`` in
    reverse order (a failing ``close`` is logged and the others still run).
    ``close`` is idempotent and also runs at interpreter exit.  Usable as a
    context manager.
    """

    def __init__(
        self,
        config: Config,
        observers: Sequence[Observer],
        clock: TriggerClock | None = None,
        plan: ReplayPlan | None = None,
    ) -> None:
        self.config = config
        self.clock = clock  # the armed observers' anomaly clock, if any observer is armed
        self.plan = plan  # which stages replay, when an armed observer selects them
        # One claim on save_path for every observer that writes there.
        self.claim = SavePathClaim(config.save_path, [o for o in observers if writes_outputs(o)], config.latest)
        self.dispatcher = Dispatcher(
            observers,
            strict=config.strict,
            max_failures=config.max_failures,
            clock=clock,
            claim=self.claim,
            plan=plan,
        )
        self.closed = False

    @property
    def observers(self) -> tuple[Observer, ...]:
        """The observers, in begin order."""
        return self.dispatcher.observers

    def close(self) -> None:
        with _lock:
            if self.closed:
                return
            self.closed = True
            if PROCESS.installation is self:
                PROCESS.installation = None
        atexit.unregister(self.close)
        self.dispatcher.disconnect()  # the clock and the plan hear anomalies through it
        if self.plan is not None and active() is self.plan:
            activate(None)
        failed = _close_all(self.dispatcher.observers)
        put_back_handlers()  # a closed observer may have put a set-up wrapper back
        if failed is not None and self.config.strict:
            raise ObserverError(f"observer {failed[0].name!r} failed to close") from failed[1]

    def __enter__(self) -> Installation:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        names = ", ".join(o.name for o in self.observers)
        return f"<Installation [{names}]{' closed' if self.closed else ''}>"


def _close_all(observers: Iterable[Observer]) -> tuple[Observer, Exception] | None:
    first: tuple[Observer, Exception] | None = None
    for observer in reversed(tuple(observers)):
        try:
            observer.close()
        except Exception as exc:
            logger.error("observer %r failed to close: %s: %s", observer.name, type(exc).__name__, exc, exc_info=exc)
            first = first or (observer, exc)
    return first


def install(
    config: Any = None,
    *,
    overrides: Iterable[str] = (),
    observers: Iterable[Observer] = (),
) -> Installation:
    """Build the configured observers, set them up and connect them.

    ``config`` is a YAML path, a mapping, an OmegaConf object or a
    :class:`Config`; ``overrides`` are dotlist strings; ``observers`` adds
    ready-made instances (their own ``selection`` and ``priority`` apply).
    Everything is validated here, before training starts: a bad config
    raises ConfigError, an observer that cannot start raises
    ObserverSetupError, and nothing stays connected.  One installation per
    process: close the current one before installing again.
    """
    cfg = config if isinstance(config, Config) else load_config(config, overrides)
    with _lock:
        if PROCESS.installation is not None:
            raise RuntimeError(
                f"verl_events is already installed in this process ({PROCESS.installation!r}); "
                "close that handle first, or put every observer in one config"
            )
        built = build_observers(cfg, observers, set_up=True)
        if not built:
            _nothing_to_observe(config, strict=cfg.strict)
        clock = arm(built)
        plan = _replay_plan(cfg, built, clock)
        installation = Installation(cfg, built, clock, plan)
        installation.dispatcher.connect()
        if plan is not None:
            activate(plan)
        PROCESS.installation = installation
    atexit.register(installation.close)
    return installation


def _replay_plan(config: Config, observers: Sequence[Observer], clock: TriggerClock | None) -> ReplayPlan | None:
    """The installation's replay plan: on when an observer is armed, unless ``replay: false``."""
    armings = [o.selection.arming for o in observers if isinstance(o.selection, ArmedSelection) and o.selection.arming]
    if config.replay is False or not armings or clock is None:
        return None  # load_config refused replay: true without an armed observer
    return ReplayPlan(armings, armed_stages(observers))


def build_observers(config: Config, extra: Iterable[Observer] = (), *, set_up: bool) -> list[Observer]:
    """The observers of ``config``'s enabled entries, in order, then the
    ready-made ``extra`` ones, as :func:`install` builds them; ``verl-events
    check`` builds them the same way with ``set_up=False``.

    Each is built with its options and its hook names checked (a method
    named ``on_...`` that is no hook is an ObserverSetupError), then all are named uniquely
    (a second ``msprobe`` entry is ``msprobe#2``) and checked together:
    exclusive resources, triggers.  Without ``set_up`` (``verl-events
    check``), an observer whose tool is missing (``unavailable()``) is an
    ObserverSetupError, or a VerlEventsWarning when it is ``optional``.
    With ``set_up``, install's two remaining steps follow: a save_path
    holding another run's files of any of them is refused (ConfigError
    naming the observer), then each is set up in order; when one fails,
    those already set up are closed.  Nothing is written or started
    without ``set_up``.

    Ctrl-C during any of it ends it by KeyboardInterrupt (those set up are
    closed), even when the interrupt surfaced inside an import as another
    exception, or was swallowed there: a tool's import is where it lands most.
    """
    context = InstallContext(save_path=config.save_path, strict=config.strict)
    ready: list[Observer] = []
    try:
        with keeping_interrupts("the observers were built and set up"):
            placed: list[tuple[Observer, str]] = []  # each observer, and where an error names it
            for spec in config.observers:
                if spec.enabled:
                    placed.append((build_observer(spec, context, set_up=False), f"{spec.where} ({spec.label})"))
            for observer in extra:
                observer.name = observer.name or type(observer).__name__
                check_hook_names(type(observer), f"observer {observer.name!r}")
                placed.append((observer, f"observer {observer.name!r}"))
            built = [observer for observer, _ in placed]
            _make_names_unique(built)
            check_exclusive_resources(built)
            check_triggers(built)
            if not set_up:
                _check_tools(placed)
                return built
            refuse_other_runs_files(config.save_path, placed)
            for observer, where in placed:
                _set_up_pointing_warnings_at_the_caller(observer, context, where)
                ready.append(observer)
    except BaseException:
        _close_all(ready)
        raise
    return built


def _set_up_pointing_warnings_at_the_caller(observer: Observer, context: InstallContext, where: str) -> None:
    """Set ``observer`` up; the warnings its setup gives are shown at the line
    that called :func:`install` (not at a line of ours, wherever the observer
    warned from).  Install holds its lock, so no other thread's warnings are
    caught here."""
    said: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            setup_observer(observer, context, where=where)
    finally:
        for warning in said:
            # this function <- build_observers <- install <- the caller
            warnings.warn(warning.message, warning.category, stacklevel=4)


def _check_tools(placed: list[tuple[Observer, str]]) -> None:
    """What ``check`` says of observers whose tool is missing: ObserverSetupError,
    or a VerlEventsWarning for an optional one."""
    for observer, where in placed:
        reason = observer.unavailable()
        if reason is None:
            continue
        if not observer.optional:
            raise ObserverSetupError(f"{where}: {reason}; or mark the observer optional: true to run without it")
        message = f"{where}: {reason}; it is optional, so the run goes on without it"
        warnings.warn(message, VerlEventsWarning, stacklevel=3)


def nothing_to_observe(config: Any) -> str:
    """What install and check say about a config that builds no observer."""
    where = f"config {str(config)!r}" if isinstance(config, (str, os.PathLike)) else "the config"
    return f"{where} has no observers; nothing will be observed (list them under observers:, or verl's global_profiler)"


def _nothing_to_observe(config: Any, *, strict: bool) -> None:
    """An empty config would install nothing without a word: say so (raise when strict)."""
    message = nothing_to_observe(config)
    if strict:
        raise ConfigError(message)
    warnings.warn(message, VerlEventsWarning, stacklevel=3)


def _make_names_unique(observers: list[Observer]) -> None:
    # Names key the timing report; two "msprobe" entries become msprobe, msprobe#2.
    seen: dict[str, int] = {}
    for observer in observers:
        count = seen.get(observer.name, 0) + 1
        seen[observer.name] = count
        if count > 1:
            observer.name = f"{observer.name}#{count}"


RESOURCES = {
    "kineto": "the torch profiler's one Kineto session per process",
    "cuda_profiler_api": "the CUDA profiler API that nsys captures with",
    "msprobe": "msprobe's one PrecisionDebugger per process",
}


def check_exclusive_resources(observers: Sequence[Observer]) -> None:
    """ConfigError when two observers would hold one exclusive resource on
    the same stage."""
    for index, first in enumerate(observers):
        for second in observers[index + 1 :]:
            for resource in sorted(first.exclusive_resources & second.exclusive_resources):
                if first.resource_selection().overlaps(second.resource_selection()):
                    what = RESOURCES.get(resource, "an exclusive resource")
                    raise ConfigError(
                        f"observers {first.name!r} and {second.name!r} both need {resource!r} ({what}) "
                        "on overlapping stages; give them disjoint steps, stages, roles or ranks, or keep one"
                    )


def current_installation() -> Installation | None:
    """The open installation of this process, or None."""
    current: Installation | None = PROCESS.installation
    return current


def start_run_folder(config: Config) -> Path:
    """Create ``config.save_path`` and point ``config.latest`` (if any) at it;
    return the save_path.  ConfigError when the folder cannot be created.

    For a launcher that fills ``{run}`` itself (:func:`~verl_events.config.load_config`)
    and hands the filled save_path on to the processes it starts, as
    ``verl-events demo --engine verl`` does for verl's workers, whose run id
    differs from its own.  Their save_path has no ``{run}`` left, so their
    claim has no ``latest`` to move: the launcher moves it when the run starts.
    """
    save_path = prepare_output_dir(config.save_path)
    if config.latest is not None:
        point_at(config.latest, save_path)
    return save_path
