"""The one module that imports msprobe, and the only user of its internals.

msprobe (``mindstudio-probe``) has a small public API -- ``PrecisionDebugger``
with start/stop/step, ``pt_compare`` -- and none of what one dump session per
stage needs: pointing the live debugger at another directory, emptying its
cache between sessions, taking its torch API wrappers off, applying a new
config to its process-wide singleton.  All of that is done here, and only
here, on objects checked when the observer is set up.

The check (the *probe*) looks up every msprobe module, class, function and
attribute this module uses, with the shape it is called with, once, at
install.  An msprobe without one of them fails setup with
:class:`verl_events.ObserverSetupError` naming the installed version and
each missing piece, instead of an AttributeError inside the first dumped
stage.  Written against mindstudio-probe 26.2 (notes:
shared/reference/msprobe-notes.md).

msprobe is imported when :func:`open_debugger` or :func:`run_compare` is
first called, never at import time.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import io
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events import ConfigError, ObserverSetupError

from ._probe import MISSING, Probe
from .layout import DUMP_FILE

logger = logging.getLogger("verl_events.msprobe")

DISTRIBUTION = "mindstudio-probe"
#: The versions we are written against; the ``msprobe`` extra of pyproject.toml pins the same.
SUPPORTED = "mindstudio-probe>=26.2,<27"
INSTALL_HINT = "pip install 'verl-events[msprobe]'"

_QUIET_LEVEL = "3"  # msprobe's ERROR; its INFO lines are print()ed to stdout
_LOG_LEVEL_ENV = "MSPROBE_LOG_LEVEL"
_LOG_MODULES = ("msprobe.core.common.log", "msprobe.pytorch.common.log")
_COMPARE_TABLES = "compare_result*.csv"  # pt_compare's output names carry a timestamp


def is_installed() -> bool:
    """Whether msprobe can be imported (without importing it)."""
    return importlib.util.find_spec("msprobe") is not None


def installed_version() -> str:
    """The installed mindstudio-probe version, e.g. ``26.2.0``."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        # msprobe importable without its distribution's metadata (a source
        # tree on sys.path): say so rather than guess a version.
        return f"(unknown version: no {DISTRIBUTION} metadata)"


# -- the probe -------------------------------------------------------------------


def _probe(purpose: str) -> Probe:
    """A probe whose error names this msprobe and what to install instead."""
    return Probe(purpose, f"msprobe {installed_version()} ({DISTRIBUTION})", SUPPORTED, INSTALL_HINT)


@dataclass(frozen=True, slots=True)
class DebuggerApi:
    """The msprobe classes the observer drives, found by :func:`probe_debugger_api`."""

    precision_debugger: Any  # msprobe.pytorch.PrecisionDebugger (the class)
    debugger_config: Any  # msprobe.pytorch.dump.debugger.debugger_config.DebuggerConfig
    service_class: Any  # msprobe.pytorch.dump.pytorch_service.PytorchService
    runtime: Any  # msprobe.core.common.runtime.Runtime (process-wide switches)


_OBSERVER = "the verl_events msprobe observer"


def probe_debugger_api(quiet: bool) -> DebuggerApi:
    """Import msprobe and check every class-level internal the observer uses.
    With ``quiet``, msprobe's loggers are created silent first (they read
    MSPROBE_LOG_LEVEL once, at import).  Raises ObserverSetupError."""
    probe = _probe(_OBSERVER)
    if quiet:
        _quiet_logs(probe)
    pytorch = probe.module("msprobe.pytorch")
    debugger = probe.function(pytorch, "msprobe.pytorch", "PrecisionDebugger", keywords=("config_path",))
    where = "msprobe.pytorch.PrecisionDebugger"
    probe.attribute(debugger, where, "_instance")  # the process-wide singleton, None until built
    probe.function(debugger, where, "start", keywords=("model", "rank_id"), kind=classmethod)
    probe.function(debugger, where, "stop", kind=classmethod)
    probe.function(debugger, where, "set_init_step", ("step",), kind=classmethod)
    probe.function(debugger, where, "_parse_config_path", ("self", "json_file_path", "task"))

    name = "msprobe.pytorch.dump.debugger.debugger_config"
    config = probe.function(
        probe.module(name), name, "DebuggerConfig", ("common_config", "task_config", "task", "dump_path", "level")
    )

    name = "msprobe.pytorch.dump.pytorch_service"
    service = probe.attribute(probe.module(name), name, "PytorchService")
    where = f"{name}.PytorchService"
    probe.function(service, where, "reset_status", ("self",))
    probe.function(service, where, "apply_runtime_config", ("self", "config"))
    probe.function(service, where, "_is_need_api_hook", kind=property)

    name = "msprobe.core.common.runtime"
    runtime = probe.attribute(probe.module(name), name, "Runtime")
    probe.attribute(runtime, f"{name}.Runtime", "is_running")
    # current_rank is only declared (annotated) until msprobe's first start sets it.
    if runtime is not MISSING and "current_rank" not in inspect.get_annotations(runtime):
        probe.missing.append(f"{name}.Runtime.current_rank")

    name = "msprobe.core.dump.data_dump.json_writer"
    writer = probe.attribute(probe.module(name), name, "DataWriter")
    probe.function(writer, f"{name}.DataWriter", "flush_data_periodically", ("self",))
    probe.raise_if_missing()
    return DebuggerApi(debugger, config, service, runtime)


def probe_debugger(api: DebuggerApi, debugger: Any) -> None:
    """Check the attributes a built PrecisionDebugger and its service carry
    (set in their constructors, so not visible on the classes).  Raises
    ObserverSetupError."""
    probe = _probe(_OBSERVER)
    where = "PrecisionDebugger()"
    for name in ("config", "common_config", "task_config", "task"):  # replaced by _apply_config
        probe.attribute(debugger, where, name)
    service = probe.attribute(debugger, where, "service")
    if service is not MISSING and not isinstance(service, api.service_class):
        probe.missing.append(f"{where}.service as a PytorchService (it is a {type(service).__name__})")
        service = MISSING
    where = "PrecisionDebugger().service"
    probe.attribute(probe.attribute(service, where, "config"), f"{where}.config", "dump_path")
    probe.attribute(service, where, "first_start")
    probe.attribute(service, where, "current_rank")
    register = probe.attribute(service, where, "api_register")
    probe.function(register, f"{where}.api_register", "register_all_api")
    probe.function(register, f"{where}.api_register", "restore_all_api")
    collector = probe.attribute(service, where, "data_collector")
    writer = probe.attribute(collector, f"{where}.data_collector", "data_writer")
    probe.function(writer, f"{where}.data_collector.data_writer", "flush_data_periodically")
    probe.raise_if_missing()


def _quiet_logs(probe: Probe) -> None:
    """Silence msprobe's INFO lines.  Its loggers read MSPROBE_LOG_LEVEL when
    they are created, so it is set around their import only, and not left
    in the environment for child processes to inherit; a logger created
    earlier in the process is quieted through its ``level``."""
    own = _LOG_LEVEL_ENV not in os.environ
    if own:
        os.environ[_LOG_LEVEL_ENV] = _QUIET_LEVEL
    try:
        modules = [(name, probe.module(name)) for name in _LOG_MODULES]
    finally:
        if own:
            del os.environ[_LOG_LEVEL_ENV]
    for name, module in modules:
        log = probe.attribute(module, name, "logger")
        if probe.attribute(log, f"{name}.logger", "level") is not MISSING:
            log.level = int(_QUIET_LEVEL)


# -- the debugger --------------------------------------------------------------------


class MsprobeDebugger:
    """msprobe's process-wide PrecisionDebugger, driven one session at a time.

    Built by :func:`open_debugger`.  A session is :meth:`start` ... :meth:`stop`;
    in between msprobe records every thread, so the caller keeps at most one
    session open (the observer's SessionSlot) and calls these under its lock.
    """

    def __init__(self, api: DebuggerApi, debugger: Any, keep_api_hooks: bool) -> None:
        self._debugger_class = api.precision_debugger
        self._runtime = api.runtime
        self._service = debugger.service
        # Levels L1, L2 and mix hook torch's API functions.  Unless kept,
        # they are put on for each session and taken off after it.
        self._unwraps = not keep_api_hooks and bool(self._service._is_need_api_hook)

    def start(self, dump_path: Path, call: int, model: Any, rank: int) -> None:
        """Open a session that msprobe writes to
        :func:`~verl_events.observers.msprobe.layout.session_dir` ``(dump_path, call, rank)``.
        ``model`` is required at levels L0 and mix.  When msprobe's start
        raises, msprobe is left idle and the exception propagates."""
        service = self._service
        service.config.dump_path = str(dump_path)
        self._debugger_class.set_init_step(call)  # msprobe's step{k} directory
        if self._unwraps:
            service.api_register.register_all_api()
        if not service.first_start:
            # msprobe takes rank_id at its first start only; this stage's rank
            # may differ (the warm-up ran before torch.distributed was up).
            service.current_rank = self._runtime.current_rank = rank
        try:
            self._debugger_class.start(model=model, rank_id=rank)
        except BaseException:
            self._reset(failed_start=True)
            raise

    def stop(self) -> None:
        """Close the session: msprobe writes dump.json, stack.json and
        construct.json, then is left idle even when writing raised."""
        try:
            self._debugger_class.stop()
        finally:
            self._reset(failed_start=False)

    def _reset(self, *, failed_start: bool) -> None:
        """Leave msprobe idle: reset_status() empties its cache, so the next
        session starts a fresh dump.json instead of rewriting this one plus
        the new data; the torch API wrappers come off.  After a failed start
        msprobe still believes it is running; clear that too, or the next
        forward pass and its exit handler would fail."""
        if failed_start:
            self._runtime.is_running = False
        self._service.reset_status()
        if self._unwraps:
            self._service.api_register.restore_all_api()


def open_debugger(
    config: Mapping[str, Any], dump_path: Path, *, source: str, quiet: bool = True, keep_api_hooks: bool = False
) -> MsprobeDebugger:
    """Probe msprobe, then configure the process's PrecisionDebugger with
    ``config`` (an msprobe config.json as a mapping; ``dump_path`` is a
    placeholder until the first session sets its own).

    msprobe keeps one debugger per process and ignores the arguments of any
    later construction, so a second call applies its config to the existing
    debugger instead.  The torch API wrappers msprobe installs at
    construction are taken off until a session starts, unless
    ``keep_api_hooks``.  ``quiet`` silences msprobe's stdout chatter.

    Raises ObserverSetupError, naming the installed msprobe version and what
    is missing, when msprobe lacks an internal used here, and ConfigError,
    naming ``source``, when msprobe rejects the config.
    """
    api = probe_debugger_api(quiet)
    existing = api.precision_debugger._instance
    if existing is not None:
        probe_debugger(api, existing)  # before anything on it is changed
    with _config_file(dict(config, dump_path=str(dump_path))) as config_file:
        try:
            if existing is None:
                debugger = api.precision_debugger(config_path=config_file)
            else:
                debugger = existing
                _apply_config(api, debugger, config_file)
        except Exception as exc:
            raise ConfigError(f"config_path {source!r}: msprobe rejected it: {type(exc).__name__}: {exc}") from exc
    if existing is None:
        # A failure here leaves msprobe's API wrappers from construction on
        # torch: the ones to take them off are what may be missing.
        probe_debugger(api, debugger)
    api.precision_debugger.set_init_step(0)
    _guard_periodic_save(debugger.service)
    service = debugger.service
    if service._is_need_api_hook:
        if keep_api_hooks:
            service.api_register.register_all_api()  # an earlier installation may have removed them
        else:
            service.api_register.restore_all_api()
    return MsprobeDebugger(api, debugger, keep_api_hooks)


@contextlib.contextmanager
def _config_file(config: Mapping[str, Any]) -> Iterator[str]:
    """A private copy of the config for msprobe to read: msprobe watches the
    file it was built from for changes, so it must not be the user's."""
    fd, path = tempfile.mkstemp(prefix="verl_events_msprobe_", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(config, handle)
        yield path
    finally:
        os.unlink(path)


def _apply_config(api: DebuggerApi, debugger: Any, config_file: str) -> None:
    """Give the existing debugger a new config, as its constructor would."""
    common, task_config = debugger._parse_config_path(config_file, None)
    config = api.debugger_config(common, task_config, None, None, None)
    debugger.common_config, debugger.task_config = common, task_config
    debugger.task, debugger.config = common.task, config
    debugger.service.apply_runtime_config(config)


class _LoggedFlush:
    """msprobe's DataWriter.flush_data_periodically, failures logged instead of raised."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self.flush = flush

    def __call__(self) -> None:
        try:
            self.flush()
        except Exception as exc:
            logger.error(
                "msprobe's periodic save of %s failed; the stage goes on: %s: %s", DUMP_FILE, type(exc).__name__, exc
            )


def _guard_periodic_save(service: Any) -> None:
    """msprobe rewrites dump.json every 1000 entries from inside its torch API
    wrappers, that is inside the stage body: a failing write (a full disk)
    would raise into training.  Log it instead.  The data stays in msprobe's
    cache; the stop at the end of the stage writes it all again, and a
    failure there is an observer failure like any other (the session stays
    marked incomplete)."""
    writer = service.data_collector.data_writer
    if not isinstance(writer.flush_data_periodically, _LoggedFlush):  # an earlier installation guarded it
        writer.flush_data_periodically = _LoggedFlush(writer.flush_data_periodically)


# -- compare ---------------------------------------------------------------------------


def run_compare(a: Path, b: Path, out_dir: Path) -> Path:
    """msprobe's compare (``pt_compare``) of two dump.json files; returns the
    CSV table it wrote in ``out_dir``.

    Raises ObserverSetupError when msprobe is not installed or lacks
    ``pt_compare`` (naming the version), and RuntimeError, with msprobe's
    exception and the end of its output, when its compare fails or writes
    no table.
    """
    if not is_installed():
        raise ObserverSetupError(
            f"msprobe is not installed, and compare runs msprobe's compare; install it with: {INSTALL_HINT}"
        )
    probe = _probe("verl-events compare")
    name = "msprobe.pytorch.compare.pt_compare"
    pt_compare = probe.function(probe.module(name), name, "pt_compare", ("input_param", "output_path"))
    probe.raise_if_missing()
    chatter = io.StringIO()  # msprobe prints and draws tqdm bars; keep them for errors only
    try:
        # msprobe's own pandas deprecation warnings are not the user's to fix.
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pt_compare({"npu_path": str(a), "bench_path": str(b), "is_print_compare_log": False}, str(out_dir))
    except Exception as exc:
        raise RuntimeError(
            f"msprobe compare of {a} and {b} failed: {type(exc).__name__}: {exc}\n{chatter.getvalue()[-2000:]}"
        ) from exc
    produced = sorted(out_dir.glob(_COMPARE_TABLES), key=lambda p: p.stat().st_mtime)
    if not produced:
        raise RuntimeError(f"msprobe compare of {a} and {b} wrote no table: {chatter.getvalue()[-2000:]}")
    return produced[-1]
