"""msprobe's PrecisionDebugger as an observer: one dump session per selected stage.

Each selected stage gets its own session, written to
``{save_path}/step_{N}/{stage}/step{k}/rank{R}/dump.json`` (verl's layout;
``k`` counts calls of that stage within the step, normally 0; the part
below the stage directory is msprobe's, see
:mod:`verl_events.observers.msprobe.layout`)::

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

Every msprobe call goes through one adapter (``msprobe._api``), which checks
at setup that the installed msprobe has each internal it uses.
:func:`msprobe_compare` is that adapter's run of msprobe's compare, for the
``compare`` tool.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import warnings
from pathlib import Path

from verl_events import (
    InstallContext,
    Observer,
    StageEnd,
    StageEvent,
    VerlEventsWarning,
    Writes,
    prepare_output_dir,
    stage_output_dir,
)

from .._session import SessionSlot
from . import _api
from ._api import MsprobeDebugger
from ._api import run_compare as msprobe_compare
from ._config import MsprobeSettings, check_msprobe_path, read_msprobe_config
from .layout import DUMP_FILE, mark_complete, mark_incomplete, session_dir, session_dirs

__all__ = ["MsprobeObserver", "msprobe_compare"]

logger = logging.getLogger("verl_events.msprobe")


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
        self._root = Path()
        self._strict = False
        self._slot = SessionSlot("msprobe", "dumped", logger)
        self._calls: dict[Path, int] = {}  # stage directory -> sessions begun there
        self._debugger: MsprobeDebugger | None = None  # set once set up, warm-up included
        self._output = Path()  # the open session's rank directory

    writes = Writes("msprobe dump(s)", session_dirs, "compare", "verl_events.apps.compare.command")

    def unavailable(self) -> str | None:
        if _api.is_installed():
            return None
        return f"msprobe is not installed; install it with: {_api.INSTALL_HINT} (package {_api.DISTRIBUTION})"

    def setup(self, context: InstallContext) -> None:
        self._root, self._strict = context.save_path, context.strict
        check_msprobe_path(context.save_path, "save_path")
        prepare_output_dir(context.save_path)
        if self.unavailable() is not None:
            message = (
                "msprobe is not installed, so the msprobe observer is off; "
                f"install it with: {_api.INSTALL_HINT} (package {_api.DISTRIBUTION})"
            )
            if context.strict and not self.optional:
                raise ImportError(message)
            warnings.warn(message, VerlEventsWarning, stacklevel=2)
            return
        debugger = _api.open_debugger(
            self.settings.config,
            context.save_path,
            source=self.settings.source,
            quiet=self.quiet,
            keep_api_hooks=self.keep_api_hooks,
        )
        if self.warm_up:
            _warm_up(debugger, context.save_path)
        self._debugger = debugger

    def on_stage_begin(self, event: StageEvent) -> None:
        debugger = self._debugger
        if debugger is None:
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
            dump_dir = stage_output_dir(self._root, event)
            call = self._calls.get(dump_dir, 0)  # a replay has a directory of its own
            output = session_dir(dump_dir, call, event.rank)
            try:
                output.mkdir(parents=True)  # atomic: of two processes, one gets it
            except FileExistsError:
                raise FileExistsError(
                    f"{output} already exists; stage {event.stage!r} of step "
                    f"{event.step} is not dumped so that two runs never mix in one {DUMP_FILE}. "
                    "Remove it or choose another save_path"
                ) from None
            self._calls[dump_dir] = call + 1
            # Until a clean stop, this session is not a whole stage: a kill -9,
            # a crash or a full disk leaves the marker, and readers say so.
            mark_incomplete(output, f"cut off during step {event.step} {event.stage} (rank {event.rank})")
            try:
                debugger.start(dump_dir, call, model, event.rank)
            except BaseException:
                shutil.rmtree(output, ignore_errors=True)  # nothing was dumped
                raise
            self._slot.holder = event
            self._output = output

    def on_stage_end(self, event: StageEnd) -> None:
        with self._slot.lock:
            if self._debugger is None or not self._slot.release(event):
                return  # msprobe is off, or this stage holds no session
            self._debugger.stop()
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
            if self._slot.holder is not None and self._debugger is not None:
                self._slot.holder = None
                self._debugger.stop()


def _warm_up(debugger: MsprobeDebugger, save_path: Path) -> None:
    """One throw-away session on a tiny model, so that msprobe's one-off
    set-up (about a second on CPU, at the first start of a process) is paid
    at install rather than inside the first dumped stage."""
    import torch

    scratch = Path(tempfile.mkdtemp(prefix=".msprobe-warm-up-", dir=save_path))
    try:
        tiny = torch.nn.Linear(2, 2)
        debugger.start(scratch, 0, tiny, 0)
        try:
            tiny(torch.ones(1, 2)).sum().backward()
        finally:
            debugger.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
