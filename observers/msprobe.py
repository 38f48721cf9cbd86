"""msprobe's PrecisionDebugger as an observer: one dump session per selected stage.

Each selected stage gets its own session, written to
``{save_path}/step_{N}/{stage}/step{k}/rank{R}/dump.json`` (verl's layout;
``k`` counts calls of that stage within the step, normally 0)::

    point msprobe at the stage's directory -> start(model) -> body
    -> stop() -> reset_status()

so every dump.json holds its own stage only.  Between sessions the torch
API wrappers msprobe installs are removed again, so unselected stages run
the plain torch functions.

msprobe's debugger is a process-wide singleton and sees every thread.  This
observer therefore holds at most one session: a stage that begins while
another stage's session is open (nested, or on another thread) is not
dumped, with a warning naming both.  That is the answer to "does msprobe
collection need a lock?": yes, and here it is.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from verl_events import (
    ConfigError,
    InstallContext,
    Observer,
    StageEnd,
    StageEvent,
    VerlEventsWarning,
    prepare_output_dir,
    stage_output_dir,
)

from verl_events.layout import (
    SavePathTaken,
    claim_save_path,
    mark_complete,
    mark_incomplete,
    refuse_other_runs,
    run_files,
    session_dirs,
)

from ._msprobe_config import MsprobeSettings, check_msprobe_path, read_msprobe_config
from ._session import SessionSlot

logger = logging.getLogger("verl_events.msprobe")

_QUIET_LEVEL = "3"  # msprobe's ERROR; its INFO lines are print()ed to stdout


class MsprobeObserver(Observer):
    """Dump precision data with msprobe (``mindstudio-probe``) for selected stages.

    Options: ``config_path`` (an msprobe config.json; default statistics at
    level L1), ``quiet`` (default True: silence msprobe's stdout chatter),
    ``warm_up`` (default True: run one throw-away session at install, so the
    first dumped stage does not pay msprobe's one-off set-up, about a second) and
    ``keep_api_hooks`` (default False: remove msprobe's torch API wrappers
    between sessions; True leaves them in place as verl does, saving about
    a millisecond per dumped stage at the cost of slower torch calls in
    every other stage).
    Levels L0 and mix need the stage's model; without one the stage runs
    undumped (an error in strict mode).
    """

    exclusive_resources = frozenset({"msprobe"})
    captures = True

    def __init__(
        self, config_path: str | None = None, quiet: bool = True, keep_api_hooks: bool = False, warm_up: bool = True
    ) -> None:
        self.settings: MsprobeSettings = read_msprobe_config(config_path)
        self.quiet = quiet
        self.keep_api_hooks = keep_api_hooks
        self.warm_up = warm_up
        self.needs_model = self.settings.needs_model
        self.available = False
        self._root = Path()
        self._strict = False
        self._slot = SessionSlot("msprobe", "dumped", logger)
        self._calls: dict[tuple[int | None, str], int] = {}
        self._debugger: Any = None
        self._claimed = False
        self._output = Path()  # the open session's rank directory

    def setup(self, context: InstallContext) -> None:
        self._root, self._strict = context.save_path, context.strict
        check_msprobe_path(context.save_path, "save_path")
        prepare_output_dir(context.save_path)
        if importlib.util.find_spec("msprobe") is None:
            message = (
                "msprobe is not installed, so the msprobe observer is off; "
                "install it with: pip install 'verl-events[msprobe]' (package mindstudio-probe)"
            )
            if context.strict:
                raise ImportError(message)
            warnings.warn(message, VerlEventsWarning, stacklevel=2)
            return
        try:
            refuse_other_runs(context.save_path, session_dirs(context.save_path), "msprobe dump(s)")
        except SavePathTaken as exc:
            raise ConfigError(str(exc)) from None
        self._debugger = _debugger_with(self.settings, context.save_path, self.quiet, self.keep_api_hooks)
        if self.warm_up:
            self._warm_up(context.save_path)
        self.available = True

    def on_stage_begin(self, event: StageEvent) -> None:
        if not self.available:
            return
        with self._slot.lock:
            if self._slot.refuse(event):
                return
            model = event.model if self.needs_model else None
            if self.needs_model and model is None:
                if self._strict:
                    raise RuntimeError(
                        f"msprobe level {self.settings.level} needs the model of stage {event.stage!r} "
                        f"(step {event.step}) and none was resolved"
                    )
                return  # the bus has already warned, naming the paths it tried
            if not self._claimed:
                # Claimed at the first dump, not at install: a process that
                # dumps nothing (verl's driver) must not claim the save_path.
                claim_save_path(self._root, run_files(self._root))
                self._claimed = True
            dump_dir = stage_output_dir(self._root, event)
            call = self._calls.get((event.step, event.stage), 0)
            output = dump_dir / f"step{call}" / f"rank{event.rank}"
            try:
                output.mkdir(parents=True)  # atomic: of two processes, one gets it
            except FileExistsError:
                raise FileExistsError(
                    f"{output} already exists; stage {event.stage!r} of step "
                    f"{event.step} is not dumped so that two runs never mix in one dump.json. "
                    "Remove it or choose another save_path"
                ) from None
            self._calls[(event.step, event.stage)] = call + 1
            # Until a clean stop, this session is not a whole stage: a kill -9,
            # a crash or a full disk leaves the marker, and readers say so.
            mark_incomplete(output, f"cut off during step {event.step} {event.stage} (rank {event.rank})")
            try:
                self._start(dump_dir, call, model, event.rank)
            except BaseException:
                shutil.rmtree(output, ignore_errors=True)  # nothing was dumped
                raise
            self._slot.holder = event
            self._output = output

    def on_stage_end(self, event: StageEnd) -> None:
        with self._slot.lock:
            if self._slot.release(event):
                self._stop()
                if event.error is None:
                    mark_complete(self._output)
                else:
                    mark_incomplete(
                        self._output,
                        f"step {event.step} {event.stage} (rank {event.rank}) raised {type(event.error).__name__}; "
                        "the dump holds the stage only up to there",
                    )

    def close(self) -> None:
        with self._slot.lock:
            if self._slot.holder is not None:
                self._slot.holder = None
                self._stop()

    # -- msprobe calls ------------------------------------------------------

    def _warm_up(self, save_path: Path) -> None:
        """One throw-away session on a tiny model, so that msprobe's one-off
        set-up (about a second on CPU, at the first start of a process) is paid
        here rather than inside the first dumped stage."""
        import torch

        scratch = Path(tempfile.mkdtemp(prefix=".msprobe-warm-up-", dir=save_path))
        try:
            tiny = torch.nn.Linear(2, 2)
            self._start(scratch, 0, tiny, 0)
            try:
                tiny(torch.ones(1, 2)).sum().backward()
            finally:
                self._stop()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _start(self, dump_dir: Path, call: int, model: Any, rank: int) -> None:
        debugger = self._debugger
        service = debugger.service
        service.config.dump_path = str(dump_dir)
        type(debugger).set_init_step(call)  # msprobe's inner step{k} directory
        if self._unwraps(service):
            service.api_register.register_all_api()
        if not service.first_start:
            # msprobe takes rank_id at its first start only; this stage's rank
            # may differ (the warm-up ran before torch.distributed was up).
            from msprobe.core.common.runtime import Runtime

            service.current_rank = Runtime.current_rank = rank
        try:
            type(debugger).start(model=model, rank_id=rank)
        except BaseException:
            _reset(service, running=True, unwrap=self._unwraps(service))
            raise

    def _stop(self) -> None:
        service = self._debugger.service
        try:
            type(self._debugger).stop()
        finally:
            # reset_status() empties msprobe's cache so the next session starts a
            # fresh dump.json instead of rewriting this one plus the new data.
            _reset(service, running=False, unwrap=self._unwraps(service))

    def _unwraps(self, service: Any) -> bool:
        return not self.keep_api_hooks and _uses_api_hooks(service)


def _uses_api_hooks(service: Any) -> bool:
    return bool(getattr(service, "_is_need_api_hook", True))


def _reset(service: Any, *, running: bool, unwrap: bool) -> None:
    """Leave msprobe idle: cache emptied, torch API wrappers removed.  After
    a failed start msprobe still believes it is running; clear that too, or
    the next forward pass and its exit handler would fail."""
    if running:
        from msprobe.core.common.runtime import Runtime

        Runtime.is_running = False
    service.reset_status()
    if unwrap:
        service.api_register.restore_all_api()


def _quiet_msprobe() -> None:
    """Silence msprobe's INFO lines.  Its loggers read MSPROBE_LOG_LEVEL when
    they are created, so it is set around their import only, and not left
    in the environment for child processes to inherit."""
    own = "MSPROBE_LOG_LEVEL" not in os.environ
    if own:
        os.environ["MSPROBE_LOG_LEVEL"] = _QUIET_LEVEL
    try:
        from msprobe.core.common import log as core_log
        from msprobe.pytorch.common import log as torch_log
    finally:
        if own:
            del os.environ["MSPROBE_LOG_LEVEL"]
    for module in (core_log, torch_log):
        module.logger.level = int(_QUIET_LEVEL)


def _debugger_with(settings: MsprobeSettings, save_path: Path, quiet: bool, keep_api_hooks: bool) -> Any:
    """The process's PrecisionDebugger, configured with ``settings``.

    msprobe keeps one debugger per process and ignores the arguments of any
    later construction, so a second installation applies its config to the
    existing debugger instead.  The torch API wrappers msprobe installs at
    construction are removed until a session starts.
    """
    if quiet:
        _quiet_msprobe()
    from msprobe.pytorch import PrecisionDebugger

    # msprobe watches the file it was built from; hand it a private copy
    # carrying a placeholder dump_path (each session sets its own).
    config = dict(settings.config, dump_path=str(save_path))
    fd, config_file = tempfile.mkstemp(prefix="verl_events_msprobe_", suffix=".json")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(config, handle)
        try:
            if PrecisionDebugger._instance is None:
                debugger = PrecisionDebugger(config_path=config_file)
            else:
                debugger = PrecisionDebugger._instance
                _apply_config(debugger, config_file)
        except Exception as exc:
            raise ConfigError(
                f"config_path {settings.source!r}: msprobe rejected it: {type(exc).__name__}: {exc}"
            ) from exc
    finally:
        os.unlink(config_file)
    PrecisionDebugger.set_init_step(0)
    _guard_periodic_save(debugger.service)
    if _uses_api_hooks(debugger.service):
        if keep_api_hooks:
            debugger.service.api_register.register_all_api()  # an earlier installation may have removed them
        else:
            debugger.service.api_register.restore_all_api()
    return debugger


def _guard_periodic_save(service: Any) -> None:
    """msprobe rewrites dump.json every 1000 entries from inside its torch API
    wrappers, that is inside the stage body: a failing write (a full disk)
    would raise into training.  Log it instead.  The data stays in msprobe's
    cache; the stop at the end of the stage writes it all again, and a
    failure there is an observer failure like any other (the session stays
    marked incomplete)."""
    writer = service.data_collector.data_writer
    flush = writer.flush_data_periodically
    if getattr(flush, "verl_events_guard", False):
        return

    def guarded() -> None:
        try:
            flush()
        except Exception as exc:
            logger.error("msprobe's periodic save of dump.json failed; the stage goes on: %s: %s", type(exc).__name__, exc)

    guarded.verl_events_guard = True  # type: ignore[attr-defined]
    writer.flush_data_periodically = guarded


def _apply_config(debugger: Any, config_file: str) -> None:
    from msprobe.pytorch.dump.debugger.debugger_config import DebuggerConfig

    common, task_config = debugger._parse_config_path(config_file, None)
    config = DebuggerConfig(common, task_config, None, None, None)
    debugger.common_config, debugger.task_config = common, task_config
    debugger.task, debugger.config = common.task, config
    debugger.service.apply_runtime_config(config)
