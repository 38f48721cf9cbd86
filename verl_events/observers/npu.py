"""The Ascend NPU profiler (``torch_npu.profiler``), per stage or across selected steps.

Options follow verl's ``NPUToolConfig``: ``level`` (level_none, level0,
level1, level2), ``contents`` (npu, cpu, memory, shapes, module, stack;
empty = npu and cpu), ``analysis`` (let torch_npu parse the raw data when
a capture ends) and ``discrete``.  torch_npu writes through its
``tensorboard_trace_handler`` into::

    discrete:   {save_path}/step_{N}/{stage}/npu_profiler_step_{N}_{stage}_rank{R}/
    continuous: {save_path}/step_{first}/npu_profiler_step_{first}-{first}_rank{R}/

(the directory of a continuous capture is named when it opens, so after
its first step), with ``rank{R}`` as torch_npu's worker name.  torch_npu
needs Ascend hardware: it is imported at install, and its absence is one
warning (an error in strict mode).
"""

from __future__ import annotations

import importlib
from typing import Any

from verl_events import InstallContext, StageEvent, Writes

from ._capture import Capture, CaptureObserver, capture_files
from .torch_profiler import check_contents

CONTENTS = ("npu", "cpu", "memory", "shapes", "module", "stack")
LEVELS = ("level_none", "level0", "level1", "level2")
_LEVEL_NAMES = {"level_none": "Level_none", "level0": "Level0", "level1": "Level1", "level2": "Level2"}


class NpuProfilerObserver(CaptureObserver):
    """Ascend NPU profiling with torch_npu (``pip install 'verl-events[npu]'``)."""

    tool = "npu_profiler"
    library = "torch_npu"
    library_missing = (
        "torch_npu is not importable ({error}); the NPU profiler needs Ascend hardware and "
        "pip install 'verl-events[npu]'"
    )
    exclusive_resources = frozenset({"kineto"})
    writes = Writes("Ascend NPU profile(s)", capture_files("npu_profiler"))

    def __init__(
        self,
        level: str = "level0",
        contents: list[str] | None = None,
        analysis: bool = True,
        discrete: bool = True,
    ) -> None:
        from verl_events import ConfigError

        super().__init__(discrete)
        if level not in LEVELS:
            raise ConfigError(f"level: {level!r} is not allowed; allowed: {', '.join(LEVELS)}")
        if not isinstance(analysis, bool):
            raise ConfigError(f"analysis: {analysis!r} is not allowed; use true or false")
        self.level = level
        self.contents = check_contents(contents, CONTENTS)
        self.analysis = analysis
        self.torch_npu: Any = None

    def setup(self, context: InstallContext) -> None:
        super().setup(context)
        if not self.active:  # its tool is missing: the base class said so
            return
        self.torch_npu = importlib.import_module("torch_npu")

    def start_capture(self, event: StageEvent) -> Any:
        npu_profiler = self.torch_npu.profiler
        wanted = set(self.contents) & {"npu", "cpu"} or {"npu", "cpu"}
        activities = [getattr(npu_profiler.ProfilerActivity, name.upper()) for name in ("cpu", "npu") if name in wanted]
        output = self.output_path(Capture(None, event, event.step), "")
        profiler = npu_profiler.profile(
            activities=activities,
            record_shapes="shapes" in self.contents,
            profile_memory="memory" in self.contents,
            with_stack="stack" in self.contents,
            with_modules="module" in self.contents,
            experimental_config=npu_profiler._ExperimentalConfig(
                profiler_level=getattr(npu_profiler.ProfilerLevel, _LEVEL_NAMES[self.level]),
                data_simplification=True,
            ),
            on_trace_ready=npu_profiler.tensorboard_trace_handler(
                str(output), worker_name=f"rank{event.rank}", analyse_flag=self.analysis
            ),
        )
        profiler.start()
        return profiler

    def stop_capture(self, capture: Capture) -> None:
        capture.handle.stop()  # runs on_trace_ready, which writes the data
