"""The tracker: stage times, overheads and anomalies in TensorBoard, W&B and MLflow.

* :mod:`.observer`: :class:`TrackerObserver`, what is sent and when;
* :mod:`.backends`: one class per tracker, each through its own client library.
"""

from .backends import BACKENDS, Backend, MlflowBackend, TensorBoardBackend, WandbBackend, tensorboard_dir
from .observer import TrackerObserver

__all__ = [
    "BACKENDS",
    "Backend",
    "MlflowBackend",
    "TensorBoardBackend",
    "TrackerObserver",
    "WandbBackend",
    "tensorboard_dir",
]
