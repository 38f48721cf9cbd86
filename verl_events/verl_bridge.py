"""Make verl's own workers emit on the bus, without editing verl.

verl 0.9 decorates its worker stages with ``@DistProfiler.annotate(role=<stage>)``
on classes that mix in ``DistProfilerExtension``.  :func:`install_verl_bridge`
finds every such method, on the classes defined so far and on any defined
later, and wraps it in :func:`verl_events.emits_stage` with that stage name.
Inside, verl's own wrapper still runs, so verl's profiler tools keep working
beside ours.  It also listens to the trainer's ``start_profile(profile_step=N)``
/ ``stop_profile()`` calls, which reach every worker through
``DistProfiler.start`` / ``stop``, to learn the global step: between them the
step is N, outside them it is unknown unless the batch's ``meta_info`` or
the worker says otherwise.

Off by default, idempotent, and undone exactly by :func:`uninstall_verl_bridge`.

In Ray workers, :func:`setup_worker` is the ``worker_process_setup_hook``:
it installs the bridge and the observers of the config that the
``VERL_EVENTS_CONFIG`` environment variable names (see docs/verl.md).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ._emit import emits_stage
from ._events import check_stage_name
from ._errors import ConfigError
from ._resolve import set_step

logger = logging.getLogger("verl_events.verl")

CONFIG_ENV = "VERL_EVENTS_CONFIG"
_BRIDGED = "__verl_events_bridged__"  # marks our wrappers; holds the function they wrap


class VerlBridgeError(RuntimeError):
    """The installed verl lacks something the bridge relies on."""


class _Bridge:
    def __init__(self) -> None:
        import verl
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
        self.patched: list[tuple[type, str, Any]] = []
        self.own_init_subclass: Any = None
        self.lock = threading.Lock()

    # -- installing ---------------------------------------------------------

    def install(self) -> None:
        self._wrap_profiler_calls()
        for cls in _subclasses(self.extension):
            self.patch_class(cls)
        bridge = self
        # Keep a hook verl itself might define, and chain to it.
        self.own_init_subclass = self.extension.__dict__.get("__init_subclass__")

        def init_subclass(cls: Any, /, **kwargs: Any) -> None:
            if bridge.own_init_subclass is not None:
                bridge.own_init_subclass.__get__(None, cls)(**kwargs)
            else:
                super(bridge.extension, cls).__init_subclass__(**kwargs)
            bridge.patch_class(cls)

        # Classes defined later (a worker module imported after install, a Ray
        # actor class rebuilt in its process) are bridged as they are created.
        self.extension.__init_subclass__ = classmethod(init_subclass)

    def uninstall(self) -> None:
        with self.lock:
            for cls, name, original in reversed(self.patched):
                setattr(cls, name, original)
            self.patched.clear()
        if self.own_init_subclass is None:
            del self.extension.__init_subclass__
        else:
            self.extension.__init_subclass__ = self.own_init_subclass
        for name in ("start", "stop"):
            current = self.dist_profiler.__dict__[name]
            setattr(self.dist_profiler, name, getattr(current, _BRIDGED))

    def patch_class(self, cls: type) -> None:
        """Wrap each of ``cls``'s own annotated methods in emits_stage."""
        with self.lock:
            for name, value in list(vars(cls).items()):
                if not inspect.isfunction(value) or hasattr(value, _BRIDGED):
                    continue
                stage = self._stage_of(value)
                if stage is None:
                    continue
                if inspect.iscoroutinefunction(value):
                    logger.warning("verl_events bridge: %s.%s is async; its stage %r is not bridged", cls.__qualname__, name, stage)
                    continue
                bridged = emits_stage(stage)(value)
                setattr(bridged, _BRIDGED, value)
                setattr(cls, name, bridged)
                self.patched.append((cls, name, value))

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
            if step is not None:
                set_step(step)
            return start(profiler, *args, **kwargs)

        @functools.wraps(stop)
        def stop_and_forget_step(profiler: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return stop(profiler, *args, **kwargs)
            finally:
                set_step(None)

        setattr(start_with_step, _BRIDGED, start)
        setattr(stop_and_forget_step, _BRIDGED, stop)
        self.dist_profiler.start = start_with_step
        self.dist_profiler.stop = stop_and_forget_step


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


_bridge: _Bridge | None = None
_bridge_lock = threading.Lock()


def install_verl_bridge() -> None:
    """Bridge verl's annotated worker methods onto the bus in this process.

    Idempotent.  Raises VerlBridgeError, naming the version and what is
    missing, when the installed verl does not have what the bridge needs.
    """
    global _bridge
    with _bridge_lock:
        if _bridge is not None:
            return
        bridge = _Bridge()
        bridge.install()
        _bridge = bridge


def uninstall_verl_bridge() -> None:
    """Put every patched verl method back as it was.  Idempotent."""
    global _bridge
    with _bridge_lock:
        if _bridge is None:
            return
        _bridge.uninstall()
        _bridge = None
        set_step(None)


def verl_bridge_installed() -> bool:
    return _bridge is not None


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: bridge and install ``$VERL_EVENTS_CONFIG``.

    A bad config raises here, so the worker fails at start with the reason
    rather than at the first stage.
    """
    from ._install import current_installation, install

    path = os.environ.get(CONFIG_ENV)
    if not path:
        logger.warning("verl_events: %s is not set; the bridge is on but no observer is installed", CONFIG_ENV)
    install_verl_bridge()
    if path and current_installation() is None:
        install(path)
