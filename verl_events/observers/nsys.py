"""Nsight Systems: an NVTX range per stage, and capture ranges for ``nsys``.

Every selected stage becomes an NVTX range (message = stage, domain
``verl_events``, category = role), visible in any nsys timeline.  With
``nsys profile --capture-range=cudaProfilerApi`` the observer also decides
what is captured, through ``torch.cuda.profiler.start()/stop()``:

* discrete (default): one capture range per selected stage;
* continuous (``discrete: false``): one capture range from the first
  selected stage of a selected step to the first stage of a step outside
  the selection.

nsys must be told how many capture ranges to expect, or the report is
never finalised (verl's fixed ``6 x steps`` breaks continuous mode):
:func:`nsys_command` computes ``repeat-shutdown:N`` from the config, and
the observer logs that line at install.  The line writes nsys's reports into
the run's save_path (``{save_path}/nsys_{pid}.nsys-rep``), where they belong
to the run like every other observer's files: a new run is refused where
another run's reports are.  Without CUDA the NVTX ranges are
still emitted and capture calls are skipped with one warning.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from pathlib import Path
from typing import Any

from verl_events import InstallContext, StageEvent, VerlEventsWarning, Writes, find_rank

from ._capture import Capture, CaptureObserver, capture_files

logger = logging.getLogger("verl_events.nsys")

DOMAIN = "verl_events"
#: nsys's report name in the suggested command (``%p``: nsys puts the process id there).
REPORT_NAME = "nsys_%p"
_REPORT_GLOB = "nsys_*.nsys-rep"


def nsys_files(save_path: Path) -> list[Path]:
    """nsys's reports written where :meth:`NsysObserver.command` points nsys, besides
    any capture files of the capture observers' naming."""
    return sorted(Path(save_path).glob(_REPORT_GLOB)) + capture_files("nsys")(save_path)


def capture_ranges(steps: frozenset[int] | None, stages: frozenset[str] | None, discrete: bool) -> int | None:
    """Capture ranges one process opens, or None when the config leaves it open.

    Discrete: one per selected stage call (steps x stages, when the process
    runs every selected stage once per step).  Continuous: one per run of
    consecutive selected steps.
    """
    if steps is None:
        return None
    if not discrete:
        ordered = sorted(steps)
        return sum(1 for i, step in enumerate(ordered) if i == 0 or step != ordered[i - 1] + 1)
    return None if stages is None else len(steps) * len(stages)


def nsys_command(
    steps: frozenset[int] | None,
    stages: frozenset[str] | None,
    discrete: bool,
    save_path: Path | str = "{save_path}",
) -> str:
    """The ``nsys profile`` options that match this selection, writing the
    reports into ``save_path``."""
    ranges = capture_ranges(steps, stages, discrete)
    end = "repeat" if ranges is None else f"repeat-shutdown:{ranges}"
    return (
        "nsys profile --trace=cuda,nvtx --capture-range=cudaProfilerApi "
        f"--capture-range-end={end} -o {Path(save_path) / REPORT_NAME} python your_training.py"
    )


class NsysObserver(CaptureObserver):
    """NVTX ranges per stage and nsys capture ranges (``pip install 'verl-events[nsys]'``).

    Option ``discrete`` (default True): a capture range per stage, or one
    across consecutive selected steps.
    """

    tool = "nsys"
    library = "nvtx"
    library_missing = "the nvtx package is not importable ({error}); install it with: pip install 'verl-events[nsys]'"
    exclusive_resources = frozenset({"cuda_profiler_api"})

    def __init__(self, discrete: bool = True) -> None:
        super().__init__(discrete)
        self.nvtx: Any = None
        self.cuda_profiler: Any = None  # torch.cuda.profiler, when CUDA is available

    def setup(self, context: InstallContext) -> None:
        super().setup(context)
        if not self.active:  # its tool is missing: the base class said so
            return
        self.nvtx = importlib.import_module("nvtx")
        import torch

        if torch.cuda.is_available():
            self.cuda_profiler = torch.cuda.profiler
        else:
            warnings.warn(
                "nsys: CUDA is not available, so capture ranges (torch.cuda.profiler.start/stop) "
                "are skipped; NVTX ranges are still emitted",
                VerlEventsWarning,
                stacklevel=2,
            )
        if find_rank()[0] == 0:
            logger.info("nsys: launch with: %s", self.command())

    writes = Writes("nsys report(s)", nsys_files)

    def command(self) -> str:
        save_path = self._root if self._root != Path() else "{save_path}"  # before setup: the placeholder
        return nsys_command(self.steps_captured, self.selection.stages, self.discrete, save_path)

    def describe(self) -> str:
        return f"launch with: {self.command()}"

    def start_capture(self, event: StageEvent) -> Any:
        if self.cuda_profiler is not None:
            self.cuda_profiler.start()
        return None

    def stop_capture(self, capture: Capture) -> None:
        if self.cuda_profiler is not None:
            self.cuda_profiler.stop()

    def begin_range(self, event: StageEvent) -> Any:
        return self.nvtx.start_range(message=event.stage, domain=DOMAIN, category=event.role or "stage")

    def end_range(self, handle: Any) -> None:
        self.nvtx.end_range(handle)
