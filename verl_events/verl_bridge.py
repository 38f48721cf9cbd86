"""Make verl's own workers emit on the bus, without editing verl.

verl 0.9 decorates its worker stages with ``@DistProfiler.annotate(role=<stage>)``
on classes that mix in ``DistProfilerExtension``.  :func:`install_verl_bridge`
finds every such method, on the classes defined so far and on any defined
later, and wraps it in :func:`verl_events.emits_stage` with that stage name.
Inside, verl's own wrapper still runs, so verl's profiler tools keep working
beside ours.  A method of ``@register`` is built again with the stage inside
TransferQueue's bridge, so that on the v1 trainer the stage sees the tensors and
not the handles (:mod:`verl_events.verl.register`).

The global step (see docs/verl.md, "Which step a stage belongs to"): verl's
trainer calls ``update_weights(global_steps=N)`` on the actor workers after
step N's actor update (and with the starting step before step 1), so in a
process that holds the actor the stages that follow belong to step N + 1.
Where no ``update_weights`` has been seen (a process holding only a critic
or a reference model), the step is the ``profile_step`` of the trainer's
``start_profile`` until its ``stop_profile``, and unknown outside them.

verl's transitions on the trainer's ranks (the weight sync, the rollout's
wake-up inside it, checkpoint save and load) are stages too:
:mod:`verl_events.verl.transitions` says which method each one wraps.  On
the v1 trainer the driver's wait for generation is the ``rollout_generate``
stage, filed under the driver's own rank (:mod:`verl_events.verl.generation`).
The rollout adapters', checkpoint engines' and replay buffer's base modules are
patched when verl imports them (:mod:`verl_events.verl.bases`; importing them
here would cost every process seconds).

Off by default, idempotent, and undone exactly by :func:`uninstall_verl_bridge`.

In Ray workers, :func:`setup_worker` is the ``worker_process_setup_hook``:
it installs the bridge and the observers of the config that the
``VERL_EVENTS_CONFIG`` environment variable names (see docs/verl.md).
"""

from __future__ import annotations

import functools
import inspect
import logging
import operator
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from verl_events.bus.emit import emits_stage
from verl_events.bus.resolve import set_step
from verl_events.events.errors import ConfigError
from verl_events.events.stages import check_stage_name
from verl_events.verl.after_import import PatchOnImport
from verl_events.verl.bases import BASES as _BASES
from verl_events.verl.register import RegisterLayers

from .events.process import PROCESS
from .verl import transitions

logger = logging.getLogger("verl_events.verl")

CONFIG_ENV = "VERL_EVENTS_CONFIG"
# Marks our wrappers.  A flag, not the wrapped function: Ray copies a method's
# attributes onto its own wrappers and pickles those by value, and the
# function we replaced can no longer be found by name, so it would be pickled
# by value too (with its module's globals).  The originals stay in _Bridge.patched.
_BRIDGED = "__verl_events_bridged__"


class VerlBridgeError(RuntimeError):
    """The installed verl lacks something the bridge relies on."""


class _Bridge:
    def __init__(self) -> None:
        import verl
        from verl.single_controller.base import decorator as verl_decorator
        from verl.utils import profiler as verl_profiler

        version = getattr(verl, "__version__", "(unknown version)")
        self.dist_profiler = _require(verl_profiler, "DistProfiler", version, "verl.utils.profiler")
        self.extension = _require(verl_profiler, "DistProfilerExtension", version, "verl.utils.profiler")
        for name in ("annotate", "start", "stop"):
            _require(self.dist_profiler, name, version, "verl.utils.profiler.DistProfiler")
        probe = self.dist_profiler.annotate(role="probe")(lambda self: None)
        if "kwargs_outer" not in inspect.getclosurevars(probe).nonlocals:
            raise VerlBridgeError(
                f"verl {version}: DistProfiler.annotate no longer keeps its role= argument where the bridge "
                "reads it (the decorator's kwargs_outer); the bridge supports verl 0.9.x"
            )
        self.annotate_code = probe.__code__
        for name in ("register", "MAGIC_ATTR"):
            _require(verl_decorator, name, version, "verl.single_controller.base.decorator")
        self.register_layers = RegisterLayers(verl_decorator)
        self.patched: list[tuple[type, str, Any]] = []
        self.own_init_subclass: Any = None
        self.on_import: PatchOnImport | None = None
        self.lock = threading.Lock()
        self.weights_step: int | None = None  # global_steps of the last update_weights
        self.profile_step: int | None = None  # profile_step of an open start_profile

    def announce_step(self) -> None:
        """Tell the bus the step of the stages that follow (see the module docstring)."""
        if self.weights_step is not None:
            set_step(self.weights_step + 1)
        else:
            set_step(self.profile_step)

    # -- installing ---------------------------------------------------------

    def install(self) -> None:
        self._wrap_profiler_calls()
        for cls in _subclasses(self.extension):
            self.patch_class(cls)
        # Keep a hook verl itself might define; _bridged_init_subclass chains to it.
        self.own_init_subclass = self.extension.__dict__.get("__init_subclass__")
        # Classes defined later (a worker module imported after install, a Ray
        # actor class rebuilt in its process) are bridged as they are created.
        self.extension.__init_subclass__ = classmethod(_bridged_init_subclass)
        self.on_import = PatchOnImport({name: self._patch_base for name in _BASES})
        for name, patch in self.on_import.patches.items():
            module = sys.modules.get(name)
            if module is not None:
                patch(module)
        sys.meta_path.insert(0, self.on_import)

    def uninstall(self) -> None:
        if self.on_import in sys.meta_path:
            sys.meta_path.remove(self.on_import)
        with self.lock:
            for cls, name, original in reversed(self.patched):
                if original is _ABSENT:
                    delattr(cls, name)
                else:
                    setattr(cls, name, original)
            self.patched.clear()
        if self.own_init_subclass is None:
            del self.extension.__init_subclass__
        else:
            self.extension.__init_subclass__ = self.own_init_subclass

    def patch_class(self, cls: type) -> None:
        """Wrap each of ``cls``'s own annotated methods in emits_stage, and
        its ``update_weights`` so that the step is learnt from it."""
        with self.lock:
            for name, value in list(vars(cls).items()):
                if not inspect.isfunction(value) or hasattr(value, _BRIDGED):
                    continue
                if name == "update_weights" and "global_steps" in inspect.signature(value).parameters:
                    self._replace(cls, name, value, transitions.weight_sync(value, _before_sync, _after_sync))
                    continue
                if name in (transitions.SAVE_CHECKPOINT, transitions.LOAD_CHECKPOINT):
                    self._replace(cls, name, value, transitions.checkpoint(name, value))
                    continue
                stage = self._stage_of(value)
                if stage is None:
                    continue
                if inspect.iscoroutinefunction(value):
                    logger.warning(
                        "verl_events bridge: %s.%s is async; its stage %r is not bridged", cls.__qualname__, name, stage
                    )
                    continue
                inside = self.register_layers.inside_tqbridge(value, emits_stage(stage))
                self._replace(cls, name, value, inside or emits_stage(stage)(value))

    def patch_subclass(self, cls: type, wraps: dict[str, Callable[..., Any]]) -> None:
        """Wrap each of ``cls``'s own methods named in ``wraps`` (a rollout adapter's, a
        checkpoint engine's: see :data:`_BASES`); a wrapper that returns None leaves it."""
        with self.lock:
            for name, wrap in wraps.items():
                value = vars(cls).get(name)
                if inspect.isfunction(value) and not hasattr(value, _BRIDGED):
                    bridged = wrap(value)
                    if bridged is not None:
                        self._replace(cls, name, value, bridged)

    def _patch_base(self, module: ModuleType) -> None:
        base_name, wraps, with_base = _BASES[module.__name__]
        base = getattr(module, base_name, None)
        if not isinstance(base, type):
            logger.warning("verl_events bridge: %s has no %s; its methods are not bridged", module.__name__, base_name)
            return
        for cls in [base] * with_base + _subclasses(base):
            self.patch_subclass(cls, wraps)
        with self.lock:
            self._replace(
                base,
                "__init_subclass__",
                base.__dict__.get("__init_subclass__", _ABSENT),
                classmethod(_bridged_base_init_subclass),
            )

    def _replace(self, owner: type, name: str, original: Any, bridged: Any) -> None:
        setattr(bridged, _BRIDGED, True)
        setattr(owner, name, bridged)
        self.patched.append((owner, name, original))

    def _stage_of(self, function: Callable[..., Any]) -> str | None:
        """The stage of a method carrying DistProfiler.annotate anywhere in
        its ``__wrapped__`` chain (verl's @register wraps it again)."""
        seen = 0
        while function is not None and seen < 8:
            if getattr(function, "__code__", None) is self.annotate_code:
                closure = inspect.getclosurevars(function).nonlocals
                role = closure["kwargs_outer"].get("role") or closure.get("message")
                try:
                    return check_stage_name(role)
                except ConfigError:
                    logger.warning("verl_events bridge: annotate role %r is not a usable stage name; not bridged", role)
                    return None
            function = getattr(function, "__wrapped__", None)  # type: ignore[assignment]
            seen += 1
        return None

    def _wrap_profiler_calls(self) -> None:
        start, stop = self.dist_profiler.start, self.dist_profiler.stop

        @functools.wraps(start)
        def start_with_step(profiler: Any, *args: Any, **kwargs: Any) -> Any:
            step = kwargs.get("profile_step", kwargs.get("global_step"))
            bridge = PROCESS.verl_bridge
            if step is not None and bridge is not None:
                bridge.profile_step = operator.index(step)
                bridge.announce_step()
            return start(profiler, *args, **kwargs)

        @functools.wraps(stop)
        def stop_and_forget_step(profiler: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return stop(profiler, *args, **kwargs)
            finally:
                bridge = PROCESS.verl_bridge
                if bridge is not None:
                    bridge.profile_step = None
                    bridge.announce_step()

        with self.lock:
            self._replace(self.dist_profiler, "start", start, start_with_step)
            self._replace(self.dist_profiler, "stop", stop, stop_and_forget_step)


def _bridged_init_subclass(cls: Any, /, **kwargs: Any) -> None:
    """``DistProfilerExtension.__init_subclass__`` while the bridge is installed.

    A module-level function on purpose: Ray records every method of a worker
    class (this one too) and pickles a worker class defined in a function,
    such as verl's colocated ``WorkerDict``, by value.  A module-level
    function pickles by reference; a closure would drag the bridge (and its
    lock) along and fail.
    """
    bridge = PROCESS.verl_bridge
    from verl.utils.profiler import DistProfilerExtension

    own = bridge.own_init_subclass if bridge is not None else None
    if own is not None:
        own.__get__(None, cls)(**kwargs)
    else:
        super(DistProfilerExtension, cls).__init_subclass__(**kwargs)
    if bridge is not None:
        bridge.patch_class(cls)


def _before_sync(global_steps: int | None) -> None:
    """The weight sync of step N, and what runs inside it, belong to step N."""
    if global_steps is not None:
        set_step(global_steps)


def _after_sync(global_steps: int | None) -> None:
    """After ``update_weights(global_steps=N)`` the stages belong to N + 1; after a sync
    that raised (None), to what they belonged to before it."""
    bridge = PROCESS.verl_bridge
    if bridge is None:
        return
    if global_steps is not None:
        bridge.weights_step = global_steps
    bridge.announce_step()


def _bridged_base_init_subclass(cls: Any, /, **kwargs: Any) -> None:
    """The ``__init_subclass__`` of each base of :data:`_BASES` while the bridge is installed:
    a rollout adapter or checkpoint engine defined later (verl imports vLLM's adapter when the
    worker builds it, a custom engine's module when the config names it) is bridged."""
    base = next(
        k
        for k in cls.__mro__[1:]
        if getattr(k.__dict__.get("__init_subclass__"), "__func__", None) is _bridged_base_init_subclass
    )
    super(base, cls).__init_subclass__(**kwargs)
    bridge = PROCESS.verl_bridge
    if bridge is not None:
        bridge.patch_subclass(cls, _BASES[base.__module__][1])


_ABSENT = object()  # an attribute the bridge added: uninstall deletes it


def _require(owner: Any, name: str, version: str, where: str) -> Any:
    try:
        return getattr(owner, name)
    except AttributeError:
        raise VerlBridgeError(
            f"verl {version} lacks {where}.{name}, which the verl_events bridge relies on; "
            "the bridge supports verl 0.9.x"
        ) from None


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    stack = [cls]
    while stack:
        subclasses: list[type] = stack.pop().__subclasses__()
        for sub in subclasses:
            if sub not in found:
                found.append(sub)
                stack.append(sub)
    return found


_bridge_lock = threading.Lock()


def install_verl_bridge() -> None:
    """Bridge verl's annotated worker methods onto the bus in this process.

    Idempotent.  Raises VerlBridgeError, naming the version and what is
    missing, when the installed verl does not have what the bridge needs.
    """
    # Outside the lock: importing verl runs verl's plugins, ours among them,
    # which may install the bridge itself.
    import verl  # noqa: F401

    with _bridge_lock:
        if PROCESS.verl_bridge is not None:
            return
        bridge = _Bridge()
        PROCESS.verl_bridge = bridge  # before install: its hooks read it
        try:
            bridge.install()
        except BaseException:
            PROCESS.verl_bridge = None
            raise


def uninstall_verl_bridge() -> None:
    """Put every patched verl method back as it was.  Idempotent."""
    with _bridge_lock:
        if PROCESS.verl_bridge is None:
            return
        PROCESS.verl_bridge.uninstall()
        PROCESS.verl_bridge = None
        set_step(None)


def verl_bridge_installed() -> bool:
    return PROCESS.verl_bridge is not None


def install_from_environment() -> None:
    """Install the bridge and ``$VERL_EVENTS_CONFIG``'s observers in this process, once.

    Any failure (a missing or bad config, a verl without what the bridge
    needs) ends the process with ``SystemExit`` and one line naming the
    config and the reason: verl's plugin loader would swallow an
    ``Exception``, and training must not go on without the observers asked for.
    """
    from verl_events.setup.install import current_installation, install

    path = os.environ.get(CONFIG_ENV)
    try:
        install_verl_bridge()
        if path and current_installation() is None:
            install(path)
    except Exception as exc:
        raise SystemExit(
            f"verl_events: {CONFIG_ENV}={path!r} could not be installed: {type(exc).__name__}: {exc}"
        ) from exc


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: bridge and install ``$VERL_EVENTS_CONFIG``.

    The alternative to verl's plugin hook (:mod:`verl_events.verl_plugin`);
    both together install once.  A bad config fails the worker at start.
    """
    if not os.environ.get(CONFIG_ENV):
        logger.warning("verl_events: %s is not set; the bridge is on but no observer is installed", CONFIG_ENV)
    install_from_environment()
