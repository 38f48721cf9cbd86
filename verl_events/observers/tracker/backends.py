"""The trackers the ``tracker`` observer writes to, each through its own client library.

One class per backend, all with the same three calls: :meth:`Backend.open`
(one run per rank, named after the verl_events run), :meth:`Backend.log`
(a step's scalars) and :meth:`Backend.close`.  Each imports its library when
a run is opened, never at import time.

* ``tensorboard``: event files under ``{save_path}/tensorboard/rank{R}``
  (or ``log_dir``), through torch's ``SummaryWriter``, as verl's own
  tensorboard logger writes them;
* ``wandb``: one W&B run per rank, grouped by the verl_events run
  (``dir`` defaults to ``save_path``; ``mode: offline`` or ``WANDB_MODE``
  keeps it off the network);
* ``mlflow``: one MLflow run per rank in the experiment named ``project``,
  on the tracking server of ``tracking_uri`` or ``MLFLOW_TRACKING_URI``.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from verl_events import ConfigError

__all__ = ["BACKENDS", "Backend", "MlflowBackend", "TensorBoardBackend", "WandbBackend", "tensorboard_dir"]

#: The folder under ``save_path`` that holds TensorBoard's event files.
TENSORBOARD_DIR = "tensorboard"
#: The folder W&B makes under its ``dir``.
WANDB_DIR = "wandb"


def tracker_files(save_path: Path) -> list[Path]:
    """Every rank's TensorBoard folder and every W&B run under ``save_path``, in their default places."""
    return tensorboard_runs(save_path) + wandb_runs(save_path)


def tensorboard_runs(save_path: Path) -> list[Path]:
    """Every rank's TensorBoard folder under ``save_path`` (the default place)."""
    return sorted(tensorboard_dir(save_path, 0).parent.glob("rank*"))


def wandb_runs(save_path: Path) -> list[Path]:
    """Every W&B run under ``save_path`` (the default place)."""
    return sorted((Path(save_path) / WANDB_DIR).glob("*run-*"))


def tensorboard_dir(save_path: Path, rank: int) -> Path:
    """Where one rank's TensorBoard event files go by default."""
    return Path(save_path) / TENSORBOARD_DIR / f"rank{rank}"


class Backend:
    """One tracker: a run per rank, scalars per step.

    ``name`` is the one config uses, ``libraries`` the modules it needs, ``extra`` the pip extra that
    brings them; ``options`` are the backend's own keyword arguments from
    config (``wandb: {mode: offline}``), checked against ``allowed`` unless
    that is None (anything goes: they are the library's own arguments).
    """

    name: ClassVar[str] = ""
    libraries: ClassVar[tuple[str, ...]] = ()
    extra: ClassVar[str] = ""
    allowed: ClassVar[frozenset[str] | None] = None

    def __init__(self, options: Mapping[str, Any] | None, where: str) -> None:
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(f"{where}: {options!r} is not allowed; use a mapping of the backend's options")
        if self.allowed is not None:
            takes = ", ".join(sorted(self.allowed))
            for key in options:
                if key not in self.allowed:
                    raise ConfigError(f"{where}.{key}: unknown option; the {self.name} backend takes {takes}")
        self.options = dict(options)

    @classmethod
    def unavailable(cls) -> str | None:
        """Why the backend cannot run here, as a sentence that says how to get it."""
        missing = [name for name in cls.libraries if importlib.util.find_spec(name) is None]
        if not missing:
            return None
        return f"{' and '.join(missing)} not installed; the tracker's {cls.name} backend needs it: " + (
            f"pip install 'verl-events[{cls.extra}]'"
        )

    def open(self, *, run: str, rank: int, save_path: Path, project: str) -> None:
        raise NotImplementedError

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        raise NotImplementedError

    def text(self, step: int, key: str, text: str) -> None:
        """A line of text at a step; backends without a text view ignore it."""

    def close(self) -> None:
        raise NotImplementedError


class TensorBoardBackend(Backend):
    name = "tensorboard"
    libraries = ("torch", "tensorboard")
    extra = "tensorboard"
    allowed = frozenset({"log_dir"})

    def open(self, *, run: str, rank: int, save_path: Path, project: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.options.get("log_dir")
        directory = Path(log_dir) / f"rank{rank}" if log_dir else tensorboard_dir(save_path, rank)
        self._writer = SummaryWriter(log_dir=str(directory))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)
        # Out to the file now, not at the writer's next two-minute flush: a
        # killed worker keeps what it sent.
        self._writer.flush()

    def text(self, step: int, key: str, text: str) -> None:
        self._writer.add_text(key, text, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbBackend(Backend):
    """Every option is a keyword argument of ``wandb.init`` (``mode``,
    ``entity``, ``tags``, ...); ``project``, ``name``, ``group`` and ``dir``
    have defaults here.  W&B's capture of the console is off unless
    ``settings`` says otherwise: the training process's stdout stays its own."""

    name = "wandb"
    libraries = ("wandb",)
    extra = "wandb"

    def open(self, *, run: str, rank: int, save_path: Path, project: str) -> None:
        import wandb

        arguments: dict[str, Any] = {
            "project": project,
            "name": f"{run}-rank{rank}",
            "group": run,
            "job_type": "verl_events",
            "dir": str(save_path),
            "config": {"verl_events_run": run, "rank": rank},
            "settings": wandb.Settings(console="off"),
        }
        arguments.update(self.options)
        # Several ranks may share a process (threads): each gets its own run.
        arguments["reinit"] = "create_new"
        self._run = wandb.init(**arguments)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowBackend(Backend):
    """``tracking_uri`` (default ``MLFLOW_TRACKING_URI``): the tracking
    server; one of the two is required.  Runs go through ``MlflowClient``,
    never MLflow's process-wide active run, which the training may use."""

    name = "mlflow"
    libraries = ("mlflow",)
    extra = "mlflow"
    allowed = frozenset({"tracking_uri"})

    def __init__(self, options: Mapping[str, Any] | None, where: str) -> None:
        super().__init__(options, where)
        self._where = where

    def open(self, *, run: str, rank: int, save_path: Path, project: str) -> None:
        from mlflow.tracking import MlflowClient

        uri = self.options.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise ConfigError(
                f"{self._where}.tracking_uri: not set, and MLFLOW_TRACKING_URI is not set either; "
                "name the MLflow tracking server (http://host:5000, or a database URI)"
            )
        self._client = MlflowClient(tracking_uri=str(uri))
        experiment = self._client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(project)
        tags = {"verl_events.run": run, "verl_events.rank": str(rank)}
        self._run_id = self._client.create_run(experiment_id, run_name=f"{run}-rank{rank}", tags=tags).info.run_id

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


#: The backends by the name config uses (verl's ``trainer.logger`` names).
BACKENDS: dict[str, type[Backend]] = {cls.name: cls for cls in (TensorBoardBackend, WandbBackend, MlflowBackend)}
