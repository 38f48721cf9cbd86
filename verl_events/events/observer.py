"""The base class every observer derives from, and what an observer declares it writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from .run_id import RunIdOnce
from .selection import ALL, Selection
from .stages import StageEnd, StageEvent, StageReport

if TYPE_CHECKING:
    from .anomaly import AnomalyEvent
    from .hang import HangEvent

#: The hooks the bus calls.  A method of an observer class named like a hook
#: (``on_...``) that is not one of these is refused at install: it would never
#: be called, and a misspelled hook fails silently otherwise.
HOOKS = ("on_stage_begin", "on_stage_end", "on_stage_report", "on_anomaly", "on_hang")


@dataclass(frozen=True, slots=True)
class Writes:
    """What an observer class writes under a save_path, declared once, on the class
    (``writes = Writes(...)``); everything else that names the tool is derived from it:

    * install refuses a save_path where another run left such files, and claims it for
      this run (:meth:`Observer.outputs` and ``output_noun`` default to these);
    * ``verl-events check`` and ``verl-events diagnose`` say what a run folder holds of them;
    * ``verl-events COMMAND`` reads them, when ``command`` is set.

    ``noun``: what the files are called, in a sentence (``"timing log(s)"``).  ``files``:
    every such file or folder under a save_path, whichever run wrote it, in a few globs (it
    is called on any thread, before install, on folders other hosts wrote).  ``command``: the
    ``verl-events`` subcommand that reads them; ``module``: that command's module, by import
    path, defining ``add_command(commands)`` and ``command(args)``.
    """

    noun: str
    files: Callable[[Path], list[Path]]
    command: str | None = None
    module: str | None = None

    def __post_init__(self) -> None:
        if (self.command is None) != (self.module is None):
            raise TypeError(f"Writes({self.noun!r}): give both command and module, or neither")


@dataclass(frozen=True, slots=True)
class InstallContext:
    """What an observer learns at install time.

    ``save_path`` is the root under which observers write
    (``{save_path}/step_{N}/{stage}/...``); ``strict`` asks observers to raise
    on problems they would otherwise only warn about; ``run_id()`` is the run id every
    record carries, the same for all the installation's observers (resolved at the
    first record: see :class:`~verl_events.events.run_id.RunIdOnce`).
    """

    save_path: Path
    strict: bool
    run_id: Callable[[], str] = field(default_factory=RunIdOnce)


class Observer:
    """Subclass this and override the hooks you need.

    The framework sets ``name``, ``priority`` and ``selection`` from the
    config before calling :meth:`setup`, and only delivers events the
    selection accepts.

    Contract:

    * every ``on_stage_begin`` is followed by exactly one ``on_stage_end``
      for the same stage (same ``seq``), also when the stage body, this
      observer's begin hook or another observer raised;
    * begin hooks run by descending ``priority``, then install order; end
      hooks run in exactly the reverse order;
    * an exception from a hook is logged and the stage goes on, unless the
      installation is strict;
    * hooks may be called from several threads at once (one per thread's
      stage); an observer that keeps state across hooks must lock it;
    * :meth:`on_anomaly` and :meth:`on_hang` are delivered with the same
      order, isolation and strict mode, on the sender's thread (a hang
      comes from the watchdog's monitor thread while the stage is stuck);
    * a method named ``on_...`` that is not one of :data:`HOOKS` is refused
      at install (ObserverSetupError): a misspelled hook would never run.

    Class attributes an observer may set:

    * ``needs_model``: the hooks need ``event.model``; when none was found,
      the bus logs which attribute paths it tried;
    * ``wants_timings``: the bus measures every observer's hook time on each
      stage this observer sees and calls :meth:`on_stage_report`;
    * ``exclusive_resources``: names of things only one observer may use at
      a time (``"kineto"``, ``"cuda_profiler_api"``, ``"msprobe"``).  Install
      rejects two observers claiming one resource on overlapping
      selections;
    * ``captures``: the observer records what runs (msprobe, torch.profiler,
      nsys, npu).  Capture observers are innermost whatever the priorities:
      they begin after, and end before, every other observer, so no other
      observer's work lands in a capture;
    * ``passive``: the observer only watches (a clock, a logger).  A stage
      it receives does not count as profiled in the timing log;
    * ``wants_result``: ``on_stage_end`` gets the stage's return value as
      ``event.result`` and its first data argument as ``event.inputs``, by
      reference (read them, do not change them).  Any receiver of that end
      event sees them too; without any observer asking, both are None and
      nothing is spent on them;
    * ``sends_anomalies``: the observer sends the ``anomaly`` signal (the
      sentinel does).  Install refuses an observer with ``trigger: anomaly``
      unless one such observer is installed with it;
    * ``sees_replays``: the observer also receives replays (``event.replay``:
      a stage run again right after it raised an anomaly, for the armed
      capture observers; see :mod:`verl_events.capture.replay`).  The sentinel
      does, to judge them; other observers never see them;
    * ``sees_driver``: the observer also receives the stages of verl's driver
      (``event.rank == DRIVER_RANK``: its wait for generation,
      ``rollout_generate``), which runs no model and no collective.  The
      timing, watchdog and memory observers do (its time, its hangs, its
      memory); a capture there would record the driver polling, and a
      per-rank tracker run would be one run too many, so others never see them;
    * ``writes``: what it writes under ``save_path`` (:class:`Writes`), or None;
    * ``output_noun``: what :meth:`outputs` lists, in the sentence that
      refuses another run's files (``"msprobe dump(s)"``); ``writes.noun`` when declared.

    Set by the framework from config: ``optional`` (``optional: true``: the
    observer may run without its tool; see :meth:`unavailable`).

    An observer that writes under ``save_path`` declares ``writes``; that is all it
    takes for "two runs never mix" (see :meth:`outputs`), and for ``check``,
    ``diagnose`` and the CLI to know its files.
    """

    name: str = ""
    priority: int = 0
    selection: Selection = ALL
    needs_model: bool = False
    wants_timings: bool = False
    exclusive_resources: frozenset[str] = frozenset()
    captures: bool = False
    passive: bool = False
    wants_result: bool = False
    sends_anomalies: bool = False
    sees_replays: bool = False
    sees_driver: bool = False
    writes: ClassVar[Writes | None] = None
    output_noun: str = "file(s)"
    optional: bool = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.writes is not None and "output_noun" not in cls.__dict__:
            cls.output_noun = cls.writes.noun  # one declaration: the noun is said once

    def setup(self, context: InstallContext) -> None:
        """Called once at install; raise here (ConfigError for bad options)
        to stop the install before training starts."""

    def outputs(self, save_path: Path) -> list[Path]:
        """The files or directories of this observer's kind under ``save_path``,
        whichever run wrote them: by default those its ``writes`` declares, or none.

        Override it when an instance writes less than its class may (options that
        turn a kind of file off, or send it elsewhere).  Install
        then refuses a ``save_path`` where another run left any of them, and
        the installation claims ``save_path`` for this run (``run.json``)
        before the first stage such an observer receives, so that two runs
        never mix.  Called before :meth:`setup`, on any thread; keep it to a
        few globs.
        """
        return self.writes.files(save_path) if self.writes is not None else []

    def unavailable(self) -> str | None:
        """Why this observer's tool cannot run here (a library that is not
        installed), as a sentence that says how to get it; None when it can.

        ``verl-events check`` asks it of every observer: an answer is an
        error there, unless the observer is ``optional`` (then a warning).
        Install leaves the verdict to :meth:`setup`.  It must not write or
        start anything; importing the library is fine.
        """
        return None

    def resource_selection(self) -> Selection:
        """The stages during which this observer holds its exclusive
        resources; an observer that captures whole steps widens it."""
        return self.selection

    def on_stage_begin(self, event: StageEvent) -> None:
        """A selected stage is about to run."""

    def on_stage_end(self, event: StageEnd) -> None:
        """A selected stage has finished (``event.error`` is set if it raised)."""

    def on_stage_report(self, report: StageReport) -> None:
        """Hook timings of a finished stage; only when ``wants_timings``."""

    def on_anomaly(self, event: AnomalyEvent) -> None:
        """A watcher sent the ``anomaly`` signal (the sentinel, from its end
        hook of ``event.stage``), for a stage, step and rank the selection
        accepts; on the sender's thread."""

    def on_hang(self, event: HangEvent) -> None:
        """A stage passed its deadline and is still running (the ``hang``
        signal), for a stage, step and rank the selection accepts; on the
        watchdog's monitor thread, not the stage's: do not block."""

    def close(self) -> None:
        """Called once when the installation closes; release files and tools."""

    def describe(self) -> str:
        """One line a user should know about this observer beyond its options
        (``verl-events check`` prints it), or ""."""
        return ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name or '(unnamed)'}>"
