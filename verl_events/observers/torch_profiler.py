"""torch.profiler traces, per selected stage (discrete) or across selected steps (continuous).

Each capture is one Chrome trace (open it in Perfetto, chrome://tracing, or
TensorBoard's profiler plugin, which finds files named ``*.pt.trace.json``)::

    discrete:   {save_path}/step_{N}/{stage}/torch_profiler_step_{N}_{stage}_rank{R}.pt.trace.json
    continuous: {save_path}/step_{first}/torch_profiler_step_{first}-{last}_rank{R}.pt.trace.json

Every stage inside a trace is a ``record_function`` range named after it.
Only one Kineto session runs per process (resource ``kineto``, shared
with the NPU profiler).
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

from verl_events import ConfigError, StageEvent, VerlEventsWarning, Writes

from ._capture import Capture, CaptureObserver, capture_files

#: The end of every trace's name: what TensorBoard's profiler plugin
#: (torch-tb-profiler) looks for; Perfetto reads the file whatever its name.
TRACE_SUFFIX = ".pt.trace.json"

#: verl's TorchProfilerToolConfig contents; empty means cpu and cuda.
CONTENTS = ("cpu", "cuda", "memory", "shapes", "stack")


def check_contents(contents: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """Validate a ``contents`` option: a list of names from ``allowed``."""
    items = [] if contents is None else contents
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"contents: {contents!r} is not allowed; use a list of {', '.join(allowed)}")
    for item in items:
        if item not in allowed:
            raise ConfigError(f"contents: {item!r} is not allowed; allowed: {', '.join(allowed)}")
    return tuple(items)


class TorchProfilerObserver(CaptureObserver):
    """Record torch.profiler traces.

    Options, like verl's ``TorchProfilerToolConfig``: ``contents`` (any of
    cpu, cuda, memory, shapes, stack; empty = cpu and cuda) and
    ``discrete`` (True: a trace per stage; False: one across the selected
    consecutive steps).
    """

    tool = "torch_profiler"
    exclusive_resources = frozenset({"kineto"})
    writes = Writes("torch.profiler trace(s)", capture_files("torch_profiler"))

    def __init__(self, contents: list[str] | None = None, discrete: bool = True) -> None:
        super().__init__(discrete)
        self.contents = check_contents(contents, CONTENTS)

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed; the torch profiler needs it: pip install torch"
        return None

    def _activities(self) -> list[Any]:
        import torch
        from torch.profiler import ProfilerActivity

        wanted = set(self.contents) & {"cpu", "cuda"} or {"cpu", "cuda"}
        activities = [ProfilerActivity.CPU] if "cpu" in wanted else []
        if "cuda" in wanted:
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            elif "cuda" in self.contents:
                warnings.warn(
                    "torch_profiler: contents asks for cuda but CUDA is not available; tracing the CPU only",
                    VerlEventsWarning,
                    stacklevel=2,
                )
        return activities or [ProfilerActivity.CPU]

    def start_capture(self, event: StageEvent) -> Any:
        import torch.profiler

        profiler = torch.profiler.profile(
            activities=self._activities(),
            record_shapes="shapes" in self.contents,
            profile_memory="memory" in self.contents,
            with_stack="stack" in self.contents,
        )
        profiler.start()
        return profiler

    def stop_capture(self, capture: Capture) -> None:
        capture.handle.stop()
        capture.handle.export_chrome_trace(str(self.output_path(capture, TRACE_SUFFIX)))

    def begin_range(self, event: StageEvent) -> Any:
        import torch.profiler

        span: Any = torch.profiler.record_function(event.stage)
        span.__enter__()
        return span

    def end_range(self, handle: Any) -> None:
        handle.__exit__(None, None, None)
