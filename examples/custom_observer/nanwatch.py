"""NaN/Inf watcher: names the first module whose output is not finite, per stage.

Besides the log line it writes ``{save_path}/step_{N}/{stage}/nanwatch_rank{R}.txt``
and declares those files (``writes``): that is all it takes for install to refuse
a save_path holding another run's reports, for the run to claim it first, and for
``verl-events check`` and ``diagnose`` to say what a run folder holds of them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from verl_events import InstallContext, Observer, StageEnd, StageEvent, Writes, stage_output_dir
from verl_events.layout import stage_dirs

logger = logging.getLogger("nanwatch")


def nanwatch_reports(save_path: Path) -> list[Path]:
    """Every nanwatch report under ``save_path``, whichever run wrote it."""
    return sorted(path for stage in stage_dirs(save_path) for path in stage.glob("nanwatch_rank*.txt"))


class NanWatchObserver(Observer):
    """Hooks every submodule of the stage's model while the stage runs."""

    needs_model = True  # the bus warns, naming the paths it tried, when there is none
    writes = Writes("nanwatch report(s)", nanwatch_reports)

    def __init__(self) -> None:
        self._handles: dict[int, list[Any]] = {}
        self._first: dict[int, str] = {}
        self._save_path = Path()

    def setup(self, context: InstallContext) -> None:
        self._save_path = context.save_path

    def on_stage_begin(self, event: StageEvent) -> None:
        chunks = event.model if isinstance(event.model, (list, tuple)) else [event.model]
        handles = self._handles[event.seq] = []
        for chunk in filter(None, chunks):
            for name, module in chunk.named_modules():
                watch = self._watcher(event.seq, name or type(module).__name__)
                handles.append(module.register_forward_hook(lambda m, i, out, w=watch: w(out)))

    def _watcher(self, seq: int, name: str) -> Any:
        def check(output: Any) -> None:
            if seq not in self._first and isinstance(output, torch.Tensor) and not torch.isfinite(output).all():
                self._first[seq] = name

        return check

    def on_stage_end(self, event: StageEnd) -> None:
        for handle in self._handles.pop(event.seq, []):
            handle.remove()
        culprit = self._first.pop(event.seq, None)
        if culprit is not None:
            logger.error(
                "stage %r (step %s, rank %s): first non-finite output from module %r",
                event.stage,
                event.step,
                event.rank,
                culprit,
            )
            report = stage_output_dir(self._save_path, event) / f"nanwatch_rank{event.rank}.txt"
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(f"{culprit}\n")
