"""The tracker observer: stage times, each observer's overhead and the sentinel's
anomalies, sent to TensorBoard, W&B or MLflow, where verl users already look.

Config::

    - name: tracker
      backends: [tensorboard, wandb]   # any of tensorboard, wandb, mlflow (default: tensorboard)
      project: my_project              # W&B project, MLflow experiment (default: verl_events)
      wandb: {mode: offline}           # keyword arguments of wandb.init
      tensorboard: {log_dir: runs/tb}  # default {save_path}/tensorboard
      mlflow: {tracking_uri: http://mlflow:5000}  # or MLFLOW_TRACKING_URI
      ranks: [0]                       # the usual selection: which ranks, stages, steps it sends

Each selected rank opens one run per backend, named ``{run}-rank{R}`` after
the verl_events run id (W&B groups a run's ranks under the run id; MLflow
tags them).  With the global step as x-axis it sends:

* ``stage_s/{stage}``: the stage's time in the step (the body alone, summed
  over the step's runs of it: ``train_batch`` runs once per mini-batch);
* ``overhead_s/{stage}``: the time the other observers' hooks added to it;
* ``hook_s/{stage}/{observer}``: each observer's hook time on that stage,
  named as the config names it (a ``_target_`` observer by its class name);
* ``anomalies/{stage}``: how many anomalies the rank's sentinel reported at
  that stage in the step, from the stage's first anomaly on (0 for a clean
  step after it), and ``anomaly/{metric}`` the value that broke a rule.
  TensorBoard also gets each anomaly's sentence in its Text tab.  Anomalies
  arrive through the ``on_anomaly`` hook, so the tracker's selection picks
  them by rank, stage and step as it picks stages.

Only figures that say something are sent: no ``overhead_s`` or ``hook_s``
value for hooks that did not run (or took no measurable time), and no
``anomalies`` series for a stage that never had one: a line of zeros from
the first step to the last says nothing.

Values are sent when the outermost stage the tracker receives ends (verl's
``actor_update``, with the ``train_batch`` calls inside it): one call per
backend per top-level stage, so a step is out as soon as its stages are,
also when the process is killed before it closes.  A stage that runs again
as a top-level stage in the same step sends its new total at the same step
(W&B keeps the last; TensorBoard and MLflow show both points).  A stage
whose step is unknown is not sent (the timing log has it).  The tracker is
passive: the stages it watches still count as unprofiled.

A backend that fails (no credentials, a server that is down) is logged once
and switched off; the others and training go on (``strict``: it raises).
A backend whose library is missing is switched off at install with a
warning (``strict``: ImportError, unless the entry is ``optional``).
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_events import (
    AnomalyEvent,
    ConfigError,
    InstallContext,
    Observer,
    StageEnd,
    StageReport,
    VerlEventsWarning,
    Writes,
)
from verl_events.layout import run_id

from .backends import BACKENDS, Backend, tensorboard_runs, tracker_files, wandb_runs

__all__ = ["TrackerObserver"]

logger = logging.getLogger("verl_events.tracker")


def _tag_name(observer: str) -> str:
    """An observer's name as a tag names it: a ``_target_`` entry is named by
    its import path (``my_pkg.probes:GradProbe#2``), which a tag shows as the
    class name (``GradProbe#2``); a dotted path or a colon reads as a folder
    or a run in the trackers' UIs."""
    return re.split(r"[:.]", observer)[-1]


@dataclass
class _Step:
    """One rank's values of its current step: the totals, and which changed since the last send."""

    step: int
    totals: dict[str, float] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)
    texts: list[tuple[str, str]] = field(default_factory=list)

    def add(self, key: str, value: float) -> None:
        self.totals[key] = self.totals.get(key, 0.0) + value
        self.changed.add(key)

    def set(self, key: str, value: float) -> None:
        self.totals[key] = value
        self.changed.add(key)

    def take(self) -> dict[str, float]:
        """The values to send now: those that changed since the last send."""
        scalars = {key: self.totals[key] for key in self.changed}
        self.changed.clear()
        return scalars


class TrackerObserver(Observer):
    """Send stage times, overheads and anomalies to trackers (see the module docstring)."""

    passive = True
    wants_timings = True
    writes = Writes("tracker file(s)", tracker_files)

    def __init__(
        self,
        backends: list[str] | None = None,
        project: str = "verl_events",
        wandb: Mapping[str, Any] | None = None,
        tensorboard: Mapping[str, Any] | None = None,
        mlflow: Mapping[str, Any] | None = None,
    ) -> None:
        names = ["tensorboard"] if backends is None else backends
        if not isinstance(names, (list, tuple)) or not names:
            raise ConfigError(f"option backends: {backends!r} is not allowed; use a list of {', '.join(BACKENDS)}")
        for name in names:
            if name not in BACKENDS:
                raise ConfigError(f"option backends: {name!r} is not a tracker; allowed: {', '.join(BACKENDS)}")
        options = {"wandb": wandb, "tensorboard": tensorboard, "mlflow": mlflow}
        for name, given in options.items():
            if given is not None and name not in names:
                raise ConfigError(f"option {name}: only applies with {name} in backends; add it, or remove {name}")
        self.project = project
        self.backends: dict[str, type[Backend]] = {name: BACKENDS[name] for name in dict.fromkeys(names)}
        self._backend_options = {name: options[name] for name in self.backends}
        for name, cls in self.backends.items():
            cls(self._backend_options[name], f"option {name}")  # checks the options now, at install
        self._root = Path()
        self._strict = False
        self._run_id: Callable[[], str] = run_id  # until setup hands over the installation's
        self._lock = threading.Lock()
        self._opened: dict[int, dict[str, Backend]] = {}
        self._steps: dict[int, _Step] = {}
        self._anomalous: dict[int, set[str]] = {}  # each rank's stages that have had an anomaly
        self._skipped_unknown_step = False

    def outputs(self, save_path: Path) -> list[Path]:
        """The TensorBoard and W&B folders this tracker writes under ``save_path``."""
        found: list[Path] = []
        if "tensorboard" in self.backends and not (self._backend_options["tensorboard"] or {}).get("log_dir"):
            found += tensorboard_runs(save_path)
        if "wandb" in self.backends and "dir" not in (self._backend_options["wandb"] or {}):
            found += wandb_runs(save_path)
        return found

    def unavailable(self) -> str | None:
        missing = [why for cls in self.backends.values() if (why := cls.unavailable()) is not None]
        return "; ".join(missing) or None

    def setup(self, context: InstallContext) -> None:
        self._root = context.save_path
        self._strict = context.strict
        self._run_id = context.run_id
        for name, cls in list(self.backends.items()):
            missing = cls.unavailable()
            if missing is None:
                continue
            if context.strict and not self.optional:
                raise ImportError(missing)
            off = f"{missing}. The {self.name} observer's {name} backend is off."
            warnings.warn(off, VerlEventsWarning, stacklevel=2)
            del self.backends[name]

    def describe(self) -> str:
        return f"sends to {', '.join(self.backends) or 'no backend'}, one run per rank"

    # -- what arrives -------------------------------------------------------

    def on_stage_report(self, report: StageReport) -> None:
        event = report.event
        if event.step is None:
            self._note_unknown_step(event.stage)
            return
        with self._lock:
            current = self._step_of(event.rank, event.step)
            current.add(f"stage_s/{event.stage}", event.elapsed_s)
            others = sum(seconds for name, seconds in report.hook_seconds.items() if name != self.name)
            if others > 0:
                current.add(f"overhead_s/{event.stage}", others)
            for name, seconds in report.hook_seconds.items():
                if seconds > 0:
                    current.add(f"hook_s/{event.stage}/{_tag_name(name)}", seconds)
            if event.stage in self._anomalous.get(event.rank, ()):
                current.add(f"anomalies/{event.stage}", 0.0)  # the sentinel's, if any, came first
            if self._outermost(event):
                self._send(event.rank, current)

    def _outermost(self, event: StageEnd) -> bool:
        """Whether no stage this tracker receives encloses this one: the end
        of such a stage sends what it and the stages inside it added."""
        stages = self.selection.stages
        return event.depth == 0 or (stages is not None and event.parent not in stages)

    def on_anomaly(self, event: AnomalyEvent) -> None:
        # The bus delivers only anomalies of the selected ranks, stages and
        # steps, and isolates a failure here from the sentinel that sent it.
        if event.step is None:
            return
        with self._lock:
            current = self._step_of(event.rank, event.step)
            self._anomalous.setdefault(event.rank, set()).add(event.stage)
            current.add(f"anomalies/{event.stage}", 1.0)
            current.set(f"anomaly/{event.metric}", event.value)
            current.texts.append(("anomaly", f"{event.stage}: {event.detail or event.rule}"))

    def close(self) -> None:
        with self._lock:
            for rank in list(self._steps):
                self._send(rank, self._steps.pop(rank))
            for rank, opened in self._opened.items():
                for name, backend in opened.items():
                    self._call(rank, name, "close the run", backend.close)
            self._opened.clear()

    # -- sending ------------------------------------------------------------

    def _step_of(self, rank: int, step: int) -> _Step:
        """This rank's values of ``step``; a new step first sends what is left
        of the one before. Under the lock."""
        current = self._steps.get(rank)
        if current is not None and current.step == step:
            return current
        if current is not None:
            self._send(rank, current)
        current = self._steps[rank] = _Step(step)
        return current

    def _send(self, rank: int, current: _Step) -> None:
        scalars = current.take()
        texts, current.texts = current.texts, []
        if not scalars and not texts:
            return
        what = f"log step {current.step}"
        for name, backend in list(self._backends_of(rank).items()):
            if self._call(rank, name, what, backend.log, current.step, scalars):
                for key, text in texts:
                    self._call(rank, name, what, backend.text, current.step, key, text)

    def _backends_of(self, rank: int) -> dict[str, Backend]:
        opened = self._opened.get(rank)
        if opened is None:
            # Opened on first use: the rank is only known once
            # torch.distributed is up, after install.
            opened = self._opened[rank] = {}
            for name, cls in self.backends.items():
                backend = cls(self._backend_options[name], f"option {name}")
                arguments = {"run": self._run_id(), "rank": rank, "save_path": self._root, "project": self.project}
                if self._call(rank, name, "open a run", backend.open, **arguments):
                    opened[name] = backend
        return opened

    def _call(self, rank: int, name: str, what: str, action: Any, /, *args: Any, **kwargs: Any) -> bool:
        """Run one backend call; a failure switches that backend off on this rank."""
        try:
            action(*args, **kwargs)
            return True
        except Exception as exc:
            if self._strict:
                raise
            logger.error(
                "tracker: the %s backend could not %s on rank %d (%s: %s); it is off for the rest of the run",
                name,
                what,
                rank,
                type(exc).__name__,
                exc,
            )
            self._opened.get(rank, {}).pop(name, None)
            return False

    def _note_unknown_step(self, stage: str) -> None:
        if not self._skipped_unknown_step:
            self._skipped_unknown_step = True
            logger.info("tracker: stage %r has no step; stages without a step are not sent", stage)
