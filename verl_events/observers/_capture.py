"""The discrete/continuous capture logic the profiler observers share.

A profiler tool (torch.profiler, torch_npu.profiler, the CUDA profiler
API for nsys) can hold one capture per process:

* discrete: a capture per selected stage, opened at its begin and closed
  at its end; a stage that begins while another holds the capture (nested,
  or on another thread) is not captured;
* continuous: one capture from the first selected stage of a selected step
  to the first stage of a step outside the selection (or to close), so
  consecutive selected steps share a capture.  To see that first stage
  outside, the observer widens its own step selection at setup and keeps
  the configured steps as ``capture_steps``.

Every stage inside a capture also gets a named range (``begin_range``).
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from verl_events import (
    ConfigError,
    InstallContext,
    Observer,
    Selection,
    StageEnd,
    StageEvent,
    VerlEventsWarning,
    find_rank,
    prepare_output_dir,
    stage_output_dir,
)
from verl_events.layout import STEP_DIR_GLOB, stage_dirs, step_dir_name, step_dirs

from ._session import SessionSlot


def capture_files(tool: str) -> Callable[[Path], list[Path]]:
    """The function listing every capture file ``tool``'s observer names (see
    :meth:`CaptureObserver.output_path`) under a save_path, discrete and continuous."""

    def files(save_path: Path) -> list[Path]:
        pattern = f"{tool}_{STEP_DIR_GLOB}_rank*"
        found = [path for stage in stage_dirs(save_path) for path in stage.glob(pattern)]
        found += [path for step in step_dirs(save_path) for path in step.glob(pattern)]
        return sorted(found)

    return files


@dataclass(slots=True)
class Capture:
    """An open capture: the tool's handle, the stage that opened it, and
    the last step it has seen (continuous)."""

    handle: Any
    opened_by: StageEvent
    last_step: int | None


class CaptureObserver(Observer):
    """Base class; subclasses set ``tool`` and implement the four tool hooks."""

    captures = True

    tool: ClassVar[str] = "capture"
    #: The module the tool needs (imported by :meth:`unavailable`), and the
    #: sentence that says it is missing, with ``{error}`` for the ImportError.
    library: ClassVar[str | None] = None
    library_missing: ClassVar[str] = "{error}"

    def __init__(self, discrete: bool = True) -> None:
        if not isinstance(discrete, bool):
            raise ConfigError(f"discrete: {discrete!r} is not allowed; use true or false")
        self.discrete = discrete
        self.active = True
        self.capture_steps: frozenset[int] | None = None
        self._root = Path()
        self._slot = SessionSlot(self.tool, "captured", logging.getLogger(f"verl_events.{self.tool}"))
        self._capture: Capture | None = None
        self._ranges: dict[int, Any] = {}
        self._calls: dict[tuple[Path, str], int] = {}

    def unavailable(self) -> str | None:
        if self.library is None:
            return None
        try:
            importlib.import_module(self.library)
        except ImportError as exc:
            return self.library_missing.format(error=exc)
        return None

    # -- tool hooks ---------------------------------------------------------

    def start_capture(self, event: StageEvent) -> Any:
        """Open a capture; return its handle."""
        raise NotImplementedError

    def stop_capture(self, capture: Capture) -> None:
        """Close a capture and write what it collected."""
        raise NotImplementedError

    def begin_range(self, event: StageEvent) -> Any:
        """Mark a stage inside the capture; return a handle for end_range."""
        return None

    def end_range(self, handle: Any) -> None:
        """Close a range from begin_range."""

    # -- framework ----------------------------------------------------------

    def setup(self, context: InstallContext) -> None:
        """Widen the selection for continuous mode; when the tool is missing
        (:meth:`unavailable`), switch the observer off with a warning, or
        raise ImportError in strict mode unless the entry is optional."""
        self._root = context.save_path
        if not self.discrete:
            self.capture_steps = self.selection.steps
            self.selection = replace(self.selection, steps=None)
        missing = self.unavailable()
        if missing is not None:
            if context.strict and not self.optional:
                raise ImportError(missing)
            warnings.warn(f"{missing}. The {self.name} observer is off.", VerlEventsWarning, stacklevel=2)
            self.active = False

    @property
    def steps_captured(self) -> frozenset[int] | None:
        """The steps this observer captures (None: every step), before or after setup."""
        return self.capture_steps if self.capture_steps is not None else self.selection.steps

    def resource_selection(self) -> Selection:
        if self.discrete:
            return self.selection
        return Selection(steps=self.steps_captured, ranks=self.selection.ranks)

    def on_stage_begin(self, event: StageEvent) -> None:
        if not self.active:
            return
        with self._slot.lock:
            if self.discrete:
                if not self._slot.refuse(event):
                    self._capture = Capture(self.start_capture(event), event, event.step)
                    self._slot.holder = event
            elif self.capture_steps is None or event.step in self.capture_steps:
                if self._capture is None:
                    self._capture = Capture(self.start_capture(event), event, event.step)
                self._capture.last_step = event.step
            else:
                self._finish()
                return
            self._ranges[event.seq] = self.begin_range(event)

    def on_stage_end(self, event: StageEnd) -> None:
        with self._slot.lock:
            if event.seq in self._ranges:
                self.end_range(self._ranges.pop(event.seq))
            if self.discrete and self._slot.release(event):
                self._finish()

    def close(self) -> None:
        with self._slot.lock:
            self._slot.holder = None
            self._finish()

    def _finish(self) -> None:
        capture, self._capture = self._capture, None
        if capture is not None:
            self.stop_capture(capture)

    # -- output naming ------------------------------------------------------

    def output_path(self, capture: Capture, suffix: str) -> Path:
        """A fresh path for a capture's file, named after stage, step and rank:

        discrete:   ``step_{N}/{stage}/{tool}_step_{N}_{stage}_rank{R}{suffix}``
        continuous: ``step_{first}/{tool}_step_{first}-{last}_rank{R}{suffix}``

        A repeated name (a stage run twice in a step, or an earlier run's
        file) gets ``_call{k}`` rather than overwriting.
        """
        event = capture.opened_by
        rank = event.rank if self.discrete else find_rank()[0]
        if self.discrete:
            directory = stage_output_dir(self._root, event)
            stem = f"{self.tool}_{step_dir_name(event.step)}_{event.stage}_rank{rank}"
        else:
            directory = self._root / step_dir_name(event.step)
            stem = f"{self.tool}_{step_dir_name(event.step)}-{capture.last_step}_rank{rank}"
        prepare_output_dir(directory)
        key = (directory, stem)  # a replay's directory is its own
        call = self._calls.get(key, 0)
        while True:
            path = directory / f"{stem}{f'_call{call}' if call else ''}{suffix}"
            call += 1
            if not path.exists():
                self._calls[key] = call
                return path
