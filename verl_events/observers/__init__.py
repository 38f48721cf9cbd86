"""Built-in observers, one module per tool.

Each module imports its tool when the observer is first used, never at
import time.  They are registered as entry points of the group
``verl_events.observers`` (see pyproject.toml), exactly like a third-party
observer, and are normally loaded by name from config: ``msprobe`` (alias
``precision_debugger``), ``timing``, ``torch_profiler``, ``nsys``, ``npu``,
the anomaly watcher ``sentinel`` (its metric reading is in
:mod:`verl_events.observers.batch.metrics`), ``tracker``, which sends stage
times and anomalies to TensorBoard, W&B or MLflow, ``watchdog``, which
reports a stage that runs past its deadline (a hang) with every thread's
stack and records how each process ended, ``mismatch``, which compares
the trainer's log-probs with the rollout engine's, token by token, and
``weight_sync``, which checks that the engine holds what each weight sync sent,
``memory``, which records each stage's host, cgroup and device memory, and
``checkpoint``, which keeps what each rank saved and checks that a resume restored it.
"""

from .checkpoint import CheckpointObserver
from .memory import MemoryObserver
from .mismatch import MismatchObserver
from .msprobe import MsprobeObserver
from .npu import NpuProfilerObserver
from .nsys import NsysObserver
from .sentinel import SentinelObserver
from .timing import TimingObserver
from .torch_profiler import TorchProfilerObserver
from .tracker import TrackerObserver
from .watchdog import WatchdogObserver
from .weight_sync import WeightSyncObserver

__all__ = [
    "CheckpointObserver",
    "MemoryObserver",
    "MismatchObserver",
    "MsprobeObserver",
    "NpuProfilerObserver",
    "NsysObserver",
    "SentinelObserver",
    "TimingObserver",
    "TorchProfilerObserver",
    "TrackerObserver",
    "WatchdogObserver",
    "WeightSyncObserver",
]
